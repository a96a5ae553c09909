"""`lace explore`'s server: what it refuses (paths, oversized bodies, malformed JSON, bad values) and that
what it shows matches the library computed independently (codes, edits, neighbours, hubs, atoms)."""

from __future__ import annotations

import csv
import io
import json
import shutil

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from lace.cli import build_parser
from lace.commands.demo import QUICK
from lace.commands.explore import EXPLORE_MARK, _demo_config, session_from_args
from lace.config import config_to_dict
from lace.demo import DemoConfig
from lace.errors import LaceInputError
from lace.explore.app import MAX_BODY_BYTES, create_app
from lace.explore.geometry import map_payload
from lace.explore.state import build_model_view, build_session
from lace.io import atomic_write_json
from tests.explore_world import TINY, K, shared_foundation, shared_session


@pytest.fixture(scope="module")
def session():
    return shared_session()


@pytest.fixture(scope="module")
def client(session):
    return TestClient(create_app(session), raise_server_exceptions=False)


def _first_transplant(client, session) -> tuple[int, str, str]:
    """The first image (by id) with a transplant the editor makes, and its source and target."""
    for image in range(session.n_images):
        for option in client.post("/api/inspect", json={"image": image}).json()["options"]:
            for target in option["targets"]["transplant"]:
                body = {"image": image, "kind": "transplant", "source": option["concept"], "target": target}
                if client.post("/api/edit", json=body).status_code == 200:
                    return image, option["concept"], target
    pytest.fail("no image of the tiny world admits a transplant")


def test_page_and_assets_come_from_the_package_with_no_cdn(client):
    page = client.get("/")
    assert page.status_code == 200 and "lace explore" in page.text
    for name in ("app.js", "style.css"):
        asset = client.get(f"/static/{name}")
        assert asset.status_code == 200 and len(asset.text) > 500
    for text in (page.text, client.get("/static/app.js").text):
        assert "http://" not in text and "https://" not in text


@pytest.mark.parametrize("path", [
    "/static/../app.py", "/static/..%2F..%2Fexplore%2Fstate.py", "/static/%2e%2e/%2e%2e/etc/passwd",
    "/static//etc/passwd", "/static/index.html/../../app.py", "/../../etc/passwd", "/api/image/..%2F..%2Fetc%2Fpasswd",
    "/api/image/%2Fetc%2Fpasswd", "/static/app.js%00.py",
])
def test_path_traversal_serves_nothing_from_disk(client, path):
    response = client.get(path)
    assert response.status_code in (404, 422)
    assert "root:" not in response.text and "import" not in response.text
    assert "error" in response.json() or response.json().get("detail")


def test_images_are_served_by_id_only(client, session):
    response = client.get("/api/image/0")
    assert response.status_code == 200 and response.content[:8] == b"\x89PNG\r\n\x1a\n"
    out_of_range = client.get(f"/api/image/{session.n_images}")
    assert out_of_range.status_code == 400 and f"0..{session.n_images - 1}" in out_of_range.json()["error"]
    assert client.get("/api/image/-1").status_code == 400
    assert client.get("/api/image/abc").status_code == 422


def test_oversized_bodies_are_refused_with_413(client):
    big = json.dumps({"caption": "x" * (MAX_BODY_BYTES + 10)})
    by_header = client.post("/api/inspect", content=big, headers={"content-type": "application/json"})
    assert by_header.status_code == 413 and "over" in by_header.json()["error"]

    def chunks():  # no content-length: the limit holds while the body streams in
        for _ in range(40):
            yield b"x" * 1024

    streamed = client.post("/api/inspect", content=chunks(), headers={"content-type": "application/json"})
    assert streamed.status_code == 413 and "over" in streamed.json()["error"]


@pytest.mark.parametrize("body", [b"{bad", b'{"image": 1', b"", b"\xff\xfe", b"[1, 2"])
def test_malformed_json_gets_422_with_a_message(client, body):
    response = client.post("/api/inspect", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    message = response.json()["error"]
    assert message and "Traceback" not in message


@pytest.mark.parametrize("body, status, words", [
    ({"image": 0, "kind": "transplant", "source": "zebra", "target": "circle"}, 400, "known concepts"),
    ({"image": 0, "kind": "transplant", "source": "red", "target": "circle"}, 400, "same type"),
    ({"caption": "   ", "kind": "attenuate", "source": "red"}, 400, "at least one word"),
    ({"image": 10 ** 6, "kind": "attenuate", "source": "red"}, 400, "image id in 0..239"),
    ({"image": -3, "kind": "attenuate", "source": "red"}, 400, "image id in 0..239"),
    ({"caption_id": 10 ** 6, "kind": "attenuate", "source": "red"}, 400, "caption id in 0..719"),
    ({"kind": "attenuate", "source": "red"}, 400, "exactly one of"),
    ({"image": 0, "caption": "a red square", "kind": "attenuate", "source": "red"}, 400, "exactly one of"),
    ({"image": 0, "kind": "teleport", "source": "red", "target": "blue"}, 422, "field 'kind'"),
    ({"image": 0, "kind": "swap", "source": "red", "target": "blue", "strength": 0}, 422, "field 'strength'"),
    ({"image": 0, "kind": "swap", "source": "red", "target": "blue", "strength": 1e9}, 422, "field 'strength'"),
    ({"image": 0, "kind": "swap", "source": "red", "target": "blue", "path": "/etc/passwd"}, 422, "field 'path'"),
    ({"image": 0, "kind": "swap", "source": "", "target": "blue"}, 422, "field 'source'"),
    ({"image": 0, "kind": "swap", "source": "red"}, 400, "target"),
    ({"image": 0, "kind": "swap", "source": "red", "target": "blue", "model": 5}, 422, "field 'model'"),
])
def test_bad_edits_get_clear_messages(client, body, status, words):
    response = client.post("/api/edit", json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]


def test_inspect_bars_are_the_dictionarys_codes(client, session):
    view = session.models[0]
    codes = view.labelled.dictionary.transform(view.image_embeddings[3:4], "image", dense=True)[0]
    bars = client.post("/api/inspect", json={"image": 3}).json()["bars"]
    assert {bar["atom"]: bar["weight"] for bar in bars} == pytest.approx(
        {int(k): float(codes[k]) for k in torch.nonzero(codes > 0).squeeze(1)}, abs=1e-5)
    names = view.labelled.directions.names
    assert all(bar["concept"] == names[int(view.labelled.labelling.atom_concept[bar["atom"]])] for bar in bars)
    typed = client.post("/api/inspect", json={"caption": "a small red circle above a large blue square"}).json()
    assert typed["modality"] == "text" and typed["bars"]


def test_only_same_type_targets_are_offered(client, session):
    directions = session.models[0].labelled.directions
    offered = 0
    for image in range(10):
        payload = client.post("/api/inspect", json={"image": image}).json()
        present = {option["concept"] for option in payload["options"]}
        for option in payload["options"]:
            for kind, targets in option["targets"].items():
                for target in targets:
                    offered += 1
                    assert directions.groups[directions.index(target)] == option["group"]
                    assert (target in present) == (kind in ("swap", "rebind"))
    assert offered > 0


def test_an_edit_shows_its_neighbours_against_an_independent_search(client, session):
    image, source, target = _first_transplant(client, session)
    body = {"image": image, "kind": "transplant", "source": source, "target": target, "strength": 2.0, "k": 6}
    result = client.post("/api/edit", json=body).json()
    view = session.models[0]
    editor = view.editor(2.0)
    edited = editor.apply(view.image_embeddings[image: image + 1], "image", f"transplant:{source}={target}")
    similarity = (view.image_embeddings @ edited.embeddings[0, 0]).numpy()
    similarity[image] = -np.inf  # the source itself is left out
    shown = result["images"]["after"]["ids"]
    assert image not in shown and len(set(shown)) == 6
    assert similarity[shown].tolist() == pytest.approx(np.sort(similarity)[::-1][:6].tolist(), abs=1e-6)
    column = session.concept_names.index(target)
    assert result["images"]["after"]["share"] == pytest.approx(session.image_mentions[shown, column].mean())
    captions = result["captions"]["after"]["ids"]
    assert result["captions"]["after"]["share"] == pytest.approx(session.text_mentions[captions, column].mean())
    assert result["record"]["kind"] == "transplant" and result["record"]["target"] == target
    assert result["images"]["random"]["ids"] != result["images"]["after"]["ids"]
    before_atoms = {bar["atom"] for bar in result["bars"]["before"]}
    assert result["bars"]["after"] != result["bars"]["before"] and before_atoms


def test_neighbour_csv_and_hubs_match_brute_force(client, session):
    view = session.models[0]
    similarity = (view.image_embeddings @ view.text_embeddings.T).numpy()  # (N_img, N_txt)
    rows = list(csv.DictReader(io.StringIO(client.get("/api/neighbours.csv?modality=image").text)))
    assert len(rows) == session.n_images * K
    first = [int(row["neighbour_id"]) for row in rows if row["query_id"] == "7"]
    assert similarity[7, first].tolist() == pytest.approx(np.sort(similarity[7])[::-1][:K].tolist(), abs=1e-6)
    top_images = np.argsort(-similarity.T, axis=1)[:, :K]  # each caption's top-k images
    occurrence = np.bincount(top_images.ravel(), minlength=session.n_images)
    point = client.get("/api/point?modality=image&id=7").json()
    assert point["n_k"] == occurrence[7]
    assert sorted(item["id"] for item in point["reverse"]) == np.flatnonzero((top_images == 7).any(1)).tolist()
    expected = len(session.captions) * K / session.n_images
    hubs = client.get("/api/map").json()["hub"][: session.n_images]
    assert hubs == (occurrence >= 2 * expected).astype(int).tolist()
    assert "mean" in point["why"] and f"{expected:.1f}" in point["why"]


def test_atom_page_reports_usage_and_top_users(client, session):
    view = session.models[0]
    atom = int(torch.argmax((view.image_codes > 0).sum(0)))
    page = client.get(f"/api/atom/{atom}").json()
    assert page["usage"]["image"] == pytest.approx(float((view.image_codes[:, atom] > 0).float().mean()))
    assert page["top_images"][0]["id"] == int(torch.argmax(view.image_codes[:, atom]))
    assert sum(page["histogram"]["image"]) == int((view.image_codes[:, atom] > 0).sum())
    assert page["concept"] == page["closest_concepts"][0]["concept"]
    assert client.get("/api/atom/999").json()["error"].endswith("(got 999)")


def test_compare_shows_both_models(client, session):
    result = client.get("/api/compare/4").json()
    assert [model["name"] for model in result["models"]] == ["demo base", "random init"]
    for model, view in zip(result["models"], session.models):
        assert [c["id"] for c in model["captions"]] == view.image_to_text[4].tolist()
        assert model["n_k"] == int(view.image_occurrence[4])


def test_search_finds_images_by_id_and_caption_words(client, session):
    assert [item["id"] for item in client.get("/api/images?q=12").json()["items"]] == [12]
    found = client.get("/api/images?q=circle&limit=200").json()
    assert found["total"] == sum(any("circle" in c for c in r.captions) for r in session.dataset.records)
    assert client.get("/api/images?limit=100000").status_code == 422


def test_without_arguments_the_demo_folder_decides_the_settings(tmp_path):
    empty = tmp_path / "new"
    quick = _demo_config(empty, progress=False)
    assert (quick.world_images, quick.base_steps) == (QUICK["world_images"], QUICK["base_steps"])
    assert (empty / EXPLORE_MARK).is_file() and _demo_config(empty, False) == quick
    finished = tmp_path / "finished"
    finished.mkdir()
    (finished / "results.json").write_text(json.dumps({"config": {"world_images": 1234, "atoms": 64}}))
    assert (_demo_config(finished, False).world_images, _demo_config(finished, False).dictionary.atoms) == (1234, 64)
    under_way = tmp_path / "under-way"
    (under_way / "stages").mkdir(parents=True)
    assert _demo_config(under_way, False) == DemoConfig(progress=False)


def test_large_maps_draw_every_hub_and_a_sample(client, session):
    view = session.models[0]
    full = client.get("/api/map").json()
    assert full["item"] == list(range(full["n_items"])) and full["n_items"] == session.n_images + len(session.captions)
    small = map_payload(view, max_points=100)
    hubs = np.flatnonzero(np.concatenate([view.hubs("image"), view.hubs("text")]))
    assert set(hubs.tolist()) <= set(small["item"]) and len(small["item"]) == max(100, len(hubs))
    assert small["item"] == sorted(small["item"]) and all(small["hub"][small["item"].index(h)] for h in hubs)


def test_every_offered_edit_is_made(client, session):
    made = {}
    for image in range(8):
        for option in client.post("/api/inspect", json={"image": image}).json()["options"]:
            for kind, targets in option["targets"].items():
                for target in targets or [None]:
                    body = {"image": image, "kind": kind, "source": option["concept"], "target": target}
                    response = client.post("/api/edit", json=body)
                    assert response.status_code == 200, response.text
                    assert response.json()["record"]["kind"] == kind
                    made[kind] = made.get(kind, 0) + 1
    assert {"attenuate", "transplant"} <= set(made)
    print(f"edits offered and made on 8 images: {made}")


def test_the_command_loads_models_dictionary_and_data_from_flags():
    foundation = shared_foundation()
    args = build_parser().parse_args([
        "explore", "--model", TINY.model, "--pretrained", str(foundation.base_path), "--dictionary",
        str(foundation.dictionary_dir), "--data", str(foundation.world_dir / "karpathy_coco.json"), "--split", "test",
        "--model2", TINY.model, "--k", "3", "--no-progress"])
    session = session_from_args(args)
    assert session.n_images == 12 and [view.k for view in session.models] == [3, 3]
    assert session.models[0].labelled is not None and session.models[1].labelled is not None
    whole = shared_session()
    row_of = {record.image_path: row for row, record in enumerate(whole.dataset.records)}
    test_rows = [row_of[record.image_path] for record in session.dataset.records]
    torch.testing.assert_close(session.models[0].image_embeddings, whole.models[0].image_embeddings[test_rows])
    with pytest.raises(LaceInputError, match="--data"):
        session_from_args(build_parser().parse_args(["explore", "--model", TINY.model]))


def test_a_model_without_dictionary_is_explored_without_codes_or_edits():
    whole = shared_session()
    view = build_model_view("no dictionary", shared_foundation().encoder, None, whole.dataset, k=K, progress=False,
                            log=lambda _: None)
    bare = TestClient(create_app(build_session(whole.dataset, [view])), raise_server_exceptions=False)
    inspected = bare.post("/api/inspect", json={"image": 0}).json()
    assert inspected["has_dictionary"] is False and "bars" not in inspected
    edit = bare.post("/api/edit", json={"image": 0, "kind": "attenuate", "source": "red"})
    assert edit.status_code == 400 and "has none" in edit.json()["error"]
    assert bare.get("/api/atom/0").status_code == 400
    assert bare.get("/api/point?modality=text&id=0").json()["forward"]


def test_without_a_model_the_demo_folder_is_reused_and_its_lace_fine_tune_compared():
    foundation = shared_foundation()
    folder = foundation.base_path.parent.parent
    atomic_write_json(folder / EXPLORE_MARK, {"config": config_to_dict(TINY)})
    shutil.copy(foundation.base_path, foundation.base_path.with_name(f"lace-seed{TINY.seed}.pt"))
    stages = {path: path.stat().st_mtime_ns for path in (folder / "stages").glob("*.json")}
    args = build_parser().parse_args(["explore", "--demo", str(folder), "--k", "3", "--no-progress"])
    session = session_from_args(args)
    assert {path: path.stat().st_mtime_ns for path in (folder / "stages").glob("*.json")} == stages
    assert [view.name for view in session.models] == ["demo base", f"{TINY.model} (lace-seed{TINY.seed}.pt)"]
    assert session.n_images == TINY.world_images  # the quick world is shown whole
    torch.testing.assert_close(session.models[1].image_embeddings, session.models[0].image_embeddings)
