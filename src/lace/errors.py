"""The one exception type for bad input.

Messages name the file (or argument), the field, and what was expected, so that a
user can fix the input without reading the code.
"""


class LaceInputError(ValueError):
    """Bad input from the user: a file, a field, a flag or a name."""


def input_error(where: object, field: str | None, expected: str, got: object = None) -> LaceInputError:
    """Build a `LaceInputError` that reads `<where>: field '<field>': expected <expected> (got <got>)`."""
    message = f"{where}"
    if field is not None:
        message += f": field '{field}'"
    message += f": expected {expected}"
    if got is not None:
        message += f" (got {got!r})"
    return LaceInputError(message)
