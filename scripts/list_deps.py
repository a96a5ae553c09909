"""Print the dependencies declared in pyproject.toml, core plus the named extras."""

import sys
import tomllib

path, *extras = sys.argv[1:]
with open(path, "rb") as f:
    project = tomllib.load(f)["project"]
deps = list(project["dependencies"])
for extra in extras:
    deps += project["optional-dependencies"][extra]
print(" ".join(dict.fromkeys(deps)))
