"""How fast the engine alone could serve bench/serve.py's workload on this CPU: the C forward's own
times, with no serving around them, turned into a single-stream and a 16-client ceiling, next to what
llama-server reached in a serve run. Says whether issue 31's targets (1x llama-server for one stream,
1.5x at 16 clients, the same weights) fit inside the engine's own math on this machine.

    python bench/cpu_ceiling.py [--models bundled:smollm2-135m-instruct] [--serve bench/results/serve_llama_8.json]
        [--peer llama-server-f32] [--prompt-tokens 200] [--max-tokens 128] [--reps 7] [--threads 2]
        [--out bench/results/cpu_ceiling.json]

Per model (bench/cpu_forward.py's forward: every layer at position 0, the matmuls are the work; each
cell the median of `--reps`, the faster of the own matmuls and OpenBLAS):
- one stream: a request costs at least forward(prompt rows) for its prefill plus max_tokens times
  forward(1 row);
- 16 clients: a request costs at least forward(prompt rows) plus max_tokens sixteenths of
  forward(16 rows).
Output tok/s is max_tokens over that, as bench/serve.py counts a level (prefill included). Attention
over a growing context, sampling and serving come on top: both are ceilings, not estimates. The log
also gives the read bandwidth two threads get here (numpy sums of a 1 GiB array, best of 5) as the
time to read every weight once, a reference for one row's forward.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder would come first on sys.path and shadow the `engine` package.
sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import threading
import time

import numpy as np

from bench import cpu_forward
from bench.gpu import table

TARGETS = {1: 1.0, 16: 1.5}  # issue 31: this server's tok/s over llama-server's, at the same weights


def read_gb_s(threads: int, total_bytes: int = 1 << 30) -> float:
    """Read bandwidth of `threads` threads each summing its share of one array (numpy frees the GIL)."""
    parts = np.array_split(np.ones(total_bytes // 4, dtype=np.float32), threads)
    best = float("inf")
    for _ in range(5):
        workers = [threading.Thread(target=np.sum, args=(p,)) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return total_bytes / best / 1e9


def peer_tok_s(serve_file: str, peer: str) -> dict[int, list[float]]:
    """{concurrency: [aggregate tok/s of each run]} of `peer` in a bench/serve.py result."""
    found: dict[int, list[float]] = {}
    for server in json.loads(Path(serve_file).read_text())["servers"]:
        if server["name"] == peer:
            for level in server["levels"]:
                found.setdefault(level["concurrency"], []).append(level["aggregate_tok_s"])
    return found


def ceilings(forward_ms: dict[str, dict], prompt: int, out: int, sizes: dict, machine: dict) -> dict:
    """Output tok/s as bench/serve.py counts it (a level's tokens over its wall time, prefill included)."""
    fastest = {int(rows): min(cell.values()) for rows, cell in forward_ms.items()}
    alone_ms = fastest[prompt] + out * fastest[1]  # one request after another
    shared_ms = fastest[prompt] + out * fastest[16] / 16  # a request's share of 16 at once
    return {
        "forward_ms": fastest,
        "prefill_gflop_s": 2 * prompt * sizes["body_params"] / fastest[prompt] / 1e6,
        "bandwidth_itl_ms": sizes["bytes"] / machine["read_gb_s"] / 1e6,
        "one_stream": {"request_ms": alone_ms, "tok_s": out * 1000 / alone_ms},
        "sixteen": {"request_ms": shared_ms, "tok_s": out * 1000 / shared_ms},
    }


def model_sizes(model: str) -> dict:
    """Bytes of every weight; logical parameters of the 2-D weights (body) and of the embedding table,
    which a tied model's head reads too (a quantized weight counts the codes its uint32s pack)."""
    import engine  # noqa: F401  # isort: split  (loads OpenBLAS before MLX)
    from engine.config import EngineConfig
    from engine.models.model_loader import load_model

    from mlx.utils import tree_flatten

    loaded = load_model(EngineConfig(model=model))
    body, head = 0, 0
    for name, module in loaded.model.named_modules():
        weight = module.get("weight") if isinstance(module, dict) else None
        if weight is None or weight.ndim != 2:
            continue
        elements = weight.shape[0] * weight.shape[1] * (32 // module.bits if hasattr(module, "bits") else 1)
        if "embed_tokens" in name or name.endswith("lm_head"):
            head = max(head, elements)
        else:
            body += elements
    weight_bytes = sum(v.nbytes for v in dict(tree_flatten(loaded.model.parameters())).values())
    return {"bytes": float(weight_bytes), "body_params": body, "head_params": head}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="bundled:smollm2-135m-instruct")
    ap.add_argument("--serve", default="bench/results/serve_llama_8.json", help="a bench/serve.py result")
    ap.add_argument("--peer", default="llama-server-f32", help="the server of --serve to compare with")
    ap.add_argument("--prompt-tokens", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="bench/results/cpu_ceiling.json")
    args = ap.parse_args()
    machine = {"read_gb_s": read_gb_s(args.threads)}
    peer = peer_tok_s(args.serve, args.peer)
    forward_args = argparse.Namespace(rows=f"1,16,{args.prompt_tokens}", reps=args.reps, threads=args.threads)
    results = {
        "machine": machine,
        "peer": {"name": args.peer, "file": args.serve, "tok_s": peer},
        "models": {},
    }
    rows = []
    for model in args.models.split(","):
        forward = cpu_forward.run_child(model, "20", forward_args)
        cell = ceilings(forward["ms"], args.prompt_tokens, args.max_tokens, model_sizes(model), machine)
        results["models"][model] = cell
        for clients, key in ((1, "one_stream"), (16, "sixteen")):
            best_peer = max(peer.get(clients, [float("nan")]))
            ceiling = cell[key]["tok_s"]
            rows.append(
                [model.removeprefix("bundled:"), clients, f"{ceiling:,.1f}", f"{best_peer:,.1f}"]
                + [f"{ceiling / best_peer:.2f}x", f"{TARGETS[clients]:.1f}x"]
            )
        log(model, cell, machine)
    headers = ["model", "clients", "engine-alone ceiling tok/s", f"{args.peer} tok/s (best run)"]
    table(headers + ["ceiling / peer", "target"], rows)
    Path(args.out).write_text(json.dumps(results, indent=1))


def log(model: str, cell: dict, machine: dict) -> None:
    forward = ", ".join(f"{rows} rows {ms:.1f}" for rows, ms in cell["forward_ms"].items())
    print(
        f"{model}: forward ms {forward}; prefill at {cell['prefill_gflop_s']:.0f} GFLOP/s; the weights "
        f"read at {machine['read_gb_s']:.1f} GB/s take {cell['bandwidth_itl_ms']:.2f} ms"
    )


if __name__ == "__main__":
    main()
