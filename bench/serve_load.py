#!/usr/bin/env python3
"""A bounded load test of `xfuser serve` (standard library only).

Starts `xfuser serve --model tiny-shapes` (one rank, or under mpirun with --np), sends --requests
image requests from --concurrency client threads (mixed sizes and step counts, every
--invalid_every-th one invalid in a way the service must refuse), then checks the service is
still healthy and drains it with SIGTERM. Writes JSON: throughput, latency percentiles, the
batch sizes the service formed (from /metrics), and the outcome of every request:

    bench/serve_load.py --xfuser build/bin/xfuser --out bench/results/serve_load.json

Exit status 1 when a valid request was not answered 200, an invalid one not 4xx, a request was
lost, the service was unhealthy afterwards or did not exit 0 on SIGTERM.
"""
import argparse
import concurrent.futures
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

# (size, steps) of the valid requests: three shapes, so batching has something to group.
SHAPES = [("64x64", 4), ("128x128", 4), ("64x128", 6)]
INVALID = [
    {"size": "100x100"},      # not a multiple of 16
    {"colour": "red"},        # unknown field
    {"n": 1000},              # over --max_n
    {"guidance_scale": "x"},  # not a number
]


def post(url, body, timeout):
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    start = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            payload = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        payload = e.read()
        status = e.code
    seconds = time.monotonic() - start
    images = 0
    if status == 200:
        images = len(json.loads(payload)["data"])
    return status, seconds, images


def percentile(values, p):
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(p / 100.0 * (len(values) - 1)))))
    return values[k]


def run_load(args, serve_flags):
    work = tempfile.mkdtemp(prefix="serve_load_")
    port_file = os.path.join(work, "port")
    command = [args.xfuser, "serve", "--model", "tiny-shapes", "--port", "0", "--port_file",
               port_file, "--output_directory", os.path.join(work, "out")]
    command += serve_flags.split()
    if args.np > 1:
        command = ["mpirun", "-np", str(args.np), "--oversubscribe"] + (
            ["--allow-run-as-root"] if os.geteuid() == 0 else []) + command
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    log = open(os.path.join(work, "serve.log"), "w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = None
    for _ in range(1200):
        if server.poll() is not None:
            sys.exit(f"serve_load: the service ended (see {work}/serve.log)")
        if os.path.exists(port_file):
            base = "http://127.0.0.1:" + open(port_file).read().strip()
            try:
                with urllib.request.urlopen(base + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError):
                pass
        time.sleep(0.1)
    rng = random.Random(args.seed)
    plan = []
    for i in range(args.requests):
        body = {"prompt": "a large red circle in the center on a blue background", "seed": i}
        if args.invalid_every and i % args.invalid_every == args.invalid_every - 1:
            body.update(INVALID[(i // args.invalid_every) % len(INVALID)])
            plan.append((body, False))
            continue
        size, steps = rng.choice(SHAPES)
        body.update({"size": size, "num_inference_steps": steps})
        plan.append((body, True))

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(args.concurrency) as pool:
        futures = [pool.submit(post, base + "/v1/images/generations", body, 600)
                   for body, _ in plan]
        results = [f.result() for f in futures]
    elapsed = time.monotonic() - start

    with urllib.request.urlopen(base + "/health", timeout=5) as r:
        healthy = r.status == 200
    with urllib.request.urlopen(base + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    batches = {int(k): int(v) for k, v in
               re.findall(r'xfuser_batches_total\{outputs="(\d+)"\} (\d+)', metrics)}
    server.send_signal(signal.SIGTERM)
    try:
        exit_code = server.wait(120)
    except subprocess.TimeoutExpired:
        server.kill()
        exit_code = None

    valid = [(r, ok) for r, (_, ok) in zip(results, plan) if ok]
    invalid = [(r, ok) for r, (_, ok) in zip(results, plan) if not ok]
    latencies = [r[1] for r, _ in valid if r[0] == 200]
    report = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "ranks": args.np,
        "serve_flags": serve_flags,
        "shapes": [{"size": s, "steps": n} for s, n in SHAPES],
        "seconds": round(elapsed, 3),
        "valid": len(valid),
        "valid_answered_200": sum(1 for r, _ in valid if r[0] == 200),
        "invalid": len(invalid),
        "invalid_answered_4xx": sum(1 for r, _ in invalid if 400 <= r[0] < 500),
        "images": sum(r[2] for r, _ in valid),
        "images_per_second": round(sum(r[2] for r, _ in valid) / elapsed, 3),
        "latency_p50_s": round(percentile(latencies, 50), 3) if latencies else None,
        "latency_p99_s": round(percentile(latencies, 99), 3) if latencies else None,
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "batches_by_outputs": batches,
        "mean_batch_outputs": round(sum(k * v for k, v in batches.items()) /
                                    max(1, sum(batches.values())), 3),
        "healthy_after": healthy,
        "exit_code_after_sigterm": exit_code,
        "load_average": os.getloadavg()[0],
    }
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare_batch_sizes", default="1,4",
                    help="run the load once per --max_batch_size listed (same requests), and "
                         "report throughput ratios against the first; empty: only --serve_flags")
    ap.add_argument("--xfuser", default="build/bin/xfuser")
    ap.add_argument("--np", type=int, default=1, help="ranks (mpirun) ; 1: no mpirun")
    ap.add_argument("--serve_flags", default="--max_batch_size 4 --batch_wait_ms 20")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--invalid_every", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    runs = []
    sizes = [x for x in args.compare_batch_sizes.split(",") if x]
    if sizes:
        for size in sizes:
            flags = re.sub(r"--max_batch_size \d+", "", args.serve_flags)
            runs.append(run_load(args, f"{flags} --max_batch_size {size}".strip()))
    else:
        runs.append(run_load(args, args.serve_flags))
    report = {"runs": runs}
    if len(runs) > 1:
        report["throughput_vs_first"] = [
            round(r["images_per_second"] / runs[0]["images_per_second"], 3) for r in runs]
        report["p50_latency_vs_first"] = [
            round(r["latency_p50_s"] / runs[0]["latency_p50_s"], 3) for r in runs]
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text + "\n")
    ok = all(r["valid_answered_200"] == r["valid"] and r["invalid_answered_4xx"] == r["invalid"]
             and r["healthy_after"] and r["exit_code_after_sigterm"] == 0 for r in runs)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
