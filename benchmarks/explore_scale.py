"""`lace explore`'s geometry at scale: 100k items (20k images, 80k captions by default).

Embeddings are synthetic unit vectors in d = 64 around 500 cluster centres (images and captions of a
cluster share its centre, with a per-modality offset: a modality gap), so top-k lists are structured
and hubs exist. Timed: the session's start-up geometry (top-k lists both ways in chunks, N_k, one-way
flags, the PCA map) and, through the app, the map (every hub and a sample of the rest, at most 20k
points drawn), a point's neighbours both ways (reverse lists scanned on the server) and the full CSV of
the caption lists. No peer: the TensorBoard projector caps at 100k points and does this in the browser.

Usage: python benchmarks/explore_scale.py [--images 20000] [--captions-per-image 4] [--threads 1]
The last printed line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import torch
from fastapi.testclient import TestClient

from lace.data.dataset import ImageTextDataset, ImageTextRecord
from lace.explore.app import create_app
from lace.explore.state import build_session, model_view_from_embeddings

DIM = 64
CLUSTERS = 500


def synthetic(n_images: int, per_image: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(N_img, d) and (N_img * per_image, d) unit vectors around shared cluster centres, and each caption's image."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.randn(CLUSTERS, DIM, generator=generator)
    gap = torch.randn(DIM, generator=generator)
    cluster = torch.randint(0, CLUSTERS, (n_images,), generator=generator)
    images = centres[cluster] + 0.6 * torch.randn(n_images, DIM, generator=generator)
    owner = torch.arange(n_images).repeat_interleave(per_image)
    texts = centres[cluster[owner]] + gap + 0.6 * torch.randn(len(owner), DIM, generator=generator)
    return images / images.norm(dim=1, keepdim=True), texts / texts.norm(dim=1, keepdim=True), owner.tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--captions-per-image", type=int, default=4)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    images, texts, owner = synthetic(args.images, args.captions_per_image)
    records = [ImageTextRecord(str(i), Path(f"synthetic/{i}.png"), tuple(f"caption {i}.{j}" for j in
               range(args.captions_per_image))) for i in range(args.images)]
    dataset = ImageTextDataset(records, "synthetic")
    start = time.perf_counter()
    view = model_view_from_embeddings("synthetic", None, None, images, texts, owner, args.k, log=lambda _: None)
    session = build_session(dataset, [view])
    startup = time.perf_counter() - start
    client = TestClient(create_app(session))
    timings = {}
    for name, path in (("map", "/api/map"), ("point_image", "/api/point?modality=image&id=7"),
                       ("point_caption", "/api/point?modality=text&id=7"),
                       ("csv_captions", "/api/neighbours.csv?modality=text")):
        start = time.perf_counter()
        response = client.get(path)
        timings[name] = {"seconds": round(time.perf_counter() - start, 3), "bytes": len(response.content),
                         "status": response.status_code}
    drawn = len(client.get("/api/map").json()["item"])
    result = {"images": args.images, "captions": len(texts), "items": args.images + len(texts), "dim": DIM,
              "k": args.k, "threads": args.threads, "startup_geometry_seconds": round(startup, 2),
              "map_points_drawn": drawn, "hubs": int(view.hubs("image").sum() + view.hubs("text").sum()),
              "requests": timings, "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
