"""Soak the REAL server (../shared/design/RELIABILITY.md, "Long runs"): mixed traffic for a bounded time, then the
numbers asked for there: non-4xx failures (must be 0), host RSS slope, GPU memory back to its baseline, latency drift.

Starts `modeld serve` in a subprocess (so the RSS sampled is the server's own) on a free loopback port, or targets
--url. --clients threads run for --seconds, each drawing one action at a time from a fixed mix:

  complete   POST /v1/completions (greedy, a few tokens); its latency is the drift series
  stream     POST /v1/chat/completions streamed to [DONE]; the chunks must carry text and the last one usage
  abort      a streamed completion hung up after its first chunk (the server must cancel it and stay healthy)
  malformed  one of a fixed set of bad bodies: must get a 4xx with an OpenAI-style error body
  session    create, ensure_prefix, snapshot, greedy decode, restore the snapshot into a second session, the same
             decode there: the tokens must be equal (restore continues bit-identically); both deleted

A 429 (`Overloaded`, the bounded queue) with a valid body is an expected answer to any action; the client then backs
off 50-300 ms. Anything else that
breaks the contract is a FAILURE: a 5xx, a 2xx where a 4xx was due, a body that is not the API's, a restore that
decodes differently, a transport error other than our own hang-up. Sampled every second: the server's RSS
(/proc/<pid>/status) and, with a GPU, the device's used memory (nvidia-ml-py). At the end: a real completion must
still succeed and /healthz must report nothing in flight.

Writes $OUT/soak.json; exits 1 if any failure (or the end checks fail), 0 otherwise.

    PYTHONPATH=src python3 bench/soak.py --out /tmp/soak --seconds 600 --clients 6     # CPU, SmolLM2 (llama.cpp)
    PYTHONPATH=src python3 bench/soak.py --out $OUT --model /tmp/q27.mspec --seconds 300  # a GPU cell
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import httpx

ACTIONS = ("complete", "stream", "abort", "malformed", "session")
WEIGHTS = (4, 2, 1, 2, 1)
MALFORMED = [  # (path, raw body): every one must be refused with a 4xx
    ("/v1/completions", b"{not json"),
    ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}'),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": -1}'),
    ("/v1/completions", b'{"prompt": ""}'),
    ("/v1/completions", b'{"prompt": [99999999]}'),
    ("/v1/completions", b'{"prompt": "hi", "model": "no-such-model"}'),
    ("/v1/chat/completions", b'{"messages": []}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "wizard", "content": "hi"}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "n": 3}'),
    ("/v1/sessions/no-such-session/decode", b"{}"),
    ("/v1/completions", b"[1, 2, 3]"),
]
PROMPTS = ["The sky is", "Once upon a time", "List three fruits:", "def add(a, b):", "The capital of France is"]


class Failure(Exception):
    """The server broke its contract (5xx, wrong status, bad body, a restore that decodes differently)."""


def error_body(r: httpx.Response) -> dict:
    try:
        err = r.json()["error"]
    except Exception:
        raise Failure(f"{r.request.url.path}: {r.status_code} without an OpenAI error body: {r.text[:200]}") from None
    if set(err) != {"message", "type", "param", "code"} or not err["message"]:
        raise Failure(f"{r.request.url.path}: malformed error body {err}")
    return err


def check(r: httpx.Response, want_ok: bool = True) -> str:
    """Classify a response: "ok" (2xx when due), "4xx" (when due, or a 429 Overloaded); raise Failure otherwise."""
    if r.status_code == 429:
        if error_body(r)["code"] != "Overloaded":
            raise Failure(f"{r.request.url.path}: 429 that is not Overloaded: {r.text[:200]}")
        return "429"
    if r.status_code >= 500:
        raise Failure(f"{r.request.url.path}: {r.status_code} {r.text[:200]}")
    if want_ok and not r.is_success:
        raise Failure(f"{r.request.url.path}: {r.status_code} where 2xx was due: {r.text[:200]}")
    if not want_ok:
        if r.is_success:
            raise Failure(f"{r.request.url.path}: {r.status_code} where a 4xx was due")
        error_body(r)
        return "4xx"
    return "ok"


def sse(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def act_complete(c: httpx.Client, rng: random.Random, lat: list) -> str:
    t0 = time.perf_counter()
    r = c.post("/v1/completions", json={"prompt": rng.choice(PROMPTS), "max_tokens": 8, "temperature": 0})
    kind = check(r)
    if kind == "ok":
        lat.append((time.time(), time.perf_counter() - t0))
        if not r.json()["choices"][0]["text"]:
            raise Failure("a completion of 8 tokens came back empty")
    return kind


def act_stream(c: httpx.Client, rng: random.Random) -> str:
    body = {"messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "max_tokens": 8, "temperature": 0.7,
            "seed": rng.randrange(1 << 20), "stream": True}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        if not r.is_success:
            r.read()
            return check(r)
        events = sse(r.iter_lines())
    if not events or events[-1] != "[DONE]" or "usage" not in events[-2]:
        raise Failure(f"a chat stream did not end with usage and [DONE]: {events[-2:]}")
    return "ok"


def act_abort(c: httpx.Client, rng: random.Random) -> str:
    with c.stream("POST", "/v1/completions", json={"prompt": rng.choice(PROMPTS), "max_tokens": 400,
                                                   "temperature": 0.8, "stream": True}) as r:
        if not r.is_success:
            r.read()
            return check(r)
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # hang up after the first chunk; closing the response closes the connection
    return "ok"


def act_malformed(c: httpx.Client, rng: random.Random) -> str:
    path, raw = rng.choice(MALFORMED)
    return check(c.post(path, content=raw, headers={"content-type": "application/json"}), want_ok=False)


def act_session(c: httpx.Client, rng: random.Random) -> str:
    made = []
    try:
        r = c.post("/v1/sessions", json={})
        if check(r) != "ok":
            return "429"
        a = r.json()["id"]
        made.append(a)
        if check(c.post(f"/v1/sessions/{a}/ensure_prefix", json={"prompt": rng.choice(PROMPTS)})) != "ok":
            return "429"
        snap = c.post(f"/v1/sessions/{a}/snapshot")
        if check(snap) != "ok":
            return "429"
        greedy = {"max_tokens": 6, "temperature": 0, "stream": False}
        want = c.post(f"/v1/sessions/{a}/decode", json=greedy)
        if check(want) != "ok":
            return "429"
        r = c.post("/v1/sessions", json={})
        if check(r) != "ok":
            return "429"
        b = r.json()["id"]
        made.append(b)
        if check(c.post(f"/v1/sessions/{b}/restore", content=snap.content,
                        headers={"content-type": "application/octet-stream"})) != "ok":
            return "429"
        got = c.post(f"/v1/sessions/{b}/decode", json=greedy)
        if check(got) != "ok":
            return "429"
        if got.json()["tokens"] != want.json()["tokens"]:
            raise Failure(f"restored session decoded {got.json()['tokens']} where the original gave "
                          f"{want.json()['tokens']}")
        return "ok"
    finally:
        for s in made:
            c.delete(f"/v1/sessions/{s}")


def rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def gpu_used_mib() -> float | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used / 2**20
    except Exception:
        return None


def window_minima(samples: list[tuple[float, float]], width_s: float = 30.0) -> list[tuple[float, float]]:
    """(window start, smallest value) per `width_s` window: the floor under transient peaks (a 27B session
    snapshot holds hundreds of MiB of host memory while it lives), whose slope tells a leak from churn."""
    out: dict[int, tuple[float, float]] = {}
    for t, v in samples:
        w = int(t // width_s)
        if w not in out or v < out[w][1]:
            out[w] = (w * width_s, v)
    return [out[w] for w in sorted(out)]


def slope_per_min(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, value) in value units per minute; None with fewer than 3 samples."""
    if len(samples) < 3:
        return None
    n = len(samples)
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    return 60 * sum((t - mt) * (v - mv) for t, v in samples) / den if den else None


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def start_server(args) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "modeld", "serve", "--port", str(port), "--max-queue", str(args.max_queue)]
    if args.model:
        cmd += ["--model", args.model]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + args.start_timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"modeld serve exited with {proc.returncode}: {proc.stdout.read()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"modeld serve did not answer /healthz within {args.start_timeout} s")


def soak(url: str, pid: int | None, args) -> dict:
    stop = time.time() + args.seconds
    counts: dict = defaultdict(Counter)
    failures: list[str] = []
    lat: list = []
    lock = threading.Lock()
    actions = {"complete": lambda c, r: act_complete(c, r, lat), "stream": act_stream, "abort": act_abort,
               "malformed": act_malformed, "session": act_session}

    def client(i: int) -> None:
        rng = random.Random(args.seed * 1000 + i)
        with httpx.Client(base_url=url, timeout=args.request_timeout) as c:
            while time.time() < stop:
                name = rng.choices(ACTIONS, WEIGHTS)[0]
                try:
                    kind = actions[name](c, rng)
                except Failure as exc:
                    kind = "FAILURE"
                    with lock:
                        failures.append(f"{name}: {exc}")
                except httpx.HTTPError as exc:
                    kind = "FAILURE"
                    with lock:
                        failures.append(f"{name}: transport {type(exc).__name__}: {exc}")
                with lock:
                    counts[name][kind] += 1
                if kind == "429":  # a client told the queue is full backs off, as a real one would
                    time.sleep(rng.uniform(0.05, 0.3))

    rss, gpu = [], []
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.clients)]
    t0 = time.time()
    gpu0 = gpu_used_mib()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        now = time.time() - t0
        if pid is not None and (m := rss_mib(pid)) is not None:
            rss.append((now, m))
        if (g := gpu_used_mib()) is not None:
            gpu.append((now, g))
        done = sum(sum(c.values()) for c in counts.values())
        print(f"\rsoak {now:6.0f} / {args.seconds} s: {done} actions, {len(failures)} failures", end="", flush=True)
        time.sleep(1.0)
    for t in threads:
        t.join()
    print(flush=True)
    third = args.seconds / 3
    early = [d for t, d in lat if t < t0 + third]
    late = [d for t, d in lat if t >= t0 + 2 * third]
    end = {}
    with httpx.Client(base_url=url, timeout=args.request_timeout) as c:
        # the last hung-up streams are still being cancelled (within a decode step each): give them --drain-s
        t_end = time.time()
        while (in_flight := c.get("/healthz").json().get("in_flight")) and time.time() < t_end + args.drain_s:
            time.sleep(0.1)
        end["in_flight_after"] = in_flight
        end["drain_s"] = time.time() - t_end
        try:
            r = c.post("/v1/completions", json={"prompt": "The sky is", "max_tokens": 4, "temperature": 0})
            end["real_completion_ok"] = r.status_code == 200 and bool(r.json()["choices"][0]["text"])
        except (httpx.HTTPError, ValueError, KeyError):
            end["real_completion_ok"] = False
    gpu_end = gpu_used_mib()
    half = [s for s in rss if s[0] >= args.seconds / 2]
    return {
        "counts": {k: dict(v) for k, v in counts.items()},
        "failures": len(failures), "failure_examples": failures[:20],
        "rss_mib": {"first": rss[0][1] if rss else None, "last": rss[-1][1] if rss else None,
                    "max": max((m for _, m in rss), default=None),
                    "slope_mib_per_min_second_half": slope_per_min(half), "samples": len(rss),
                    # the floor under transient peaks (30 s window minima), over the whole run
                    "floor_slope_mib_per_min": slope_per_min(window_minima(rss)),
                    "series": [(round(t, 1), round(m, 1)) for t, m in rss]},
        "gpu_used_mib": {"before": gpu0, "max": max((g for _, g in gpu), default=None), "after": gpu_end},
        "complete_latency_s": {"first_third": {"p50": pct(early, 0.5), "p99": pct(early, 0.99), "n": len(early)},
                               "last_third": {"p50": pct(late, 0.5), "p99": pct(late, 0.99), "n": len(late)}},
        "end": end,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="where soak.json goes")
    ap.add_argument("--seconds", type=float, default=300.0, help="how long the mixed traffic runs (default 300)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent client threads (default 4)")
    ap.add_argument("--max-queue", type=int, default=3, help="the server's --max-queue (default 3: 429s get exercised)")
    ap.add_argument("--model", default=None, help="the server's --model (default: its own default, smollm2)")
    ap.add_argument("--url", default=None, help="soak a running server instead of starting one (no RSS then)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every client's action draw")
    ap.add_argument("--request-timeout", type=float, default=120.0, help="client timeout per request (s)")
    ap.add_argument("--start-timeout", type=float, default=180.0, help="how long the server may take to start (s)")
    ap.add_argument("--drain-s", type=float, default=15.0,
                    help="after the traffic, how long requests may still be in flight (aborts being cancelled)")
    args = ap.parse_args(argv)
    if args.seconds <= 0 or args.clients < 1 or args.max_queue < 1:
        ap.error("--seconds must be > 0, --clients and --max-queue >= 1")
    os.makedirs(args.out, exist_ok=True)
    proc = None
    if args.url:
        url, pid = args.url.rstrip("/"), None
    else:
        proc, url = start_server(args)
        pid = proc.pid
    try:
        res = soak(url, pid, args)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    res.update({"bench": "soak", "argv": sys.argv[1:] if argv is None else argv, "url": url,
                "seconds": args.seconds, "clients": args.clients, "max_queue": args.max_queue, "model": args.model,
                "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    ok = res["failures"] == 0 and res["end"]["real_completion_ok"] and res["end"]["in_flight_after"] == 0
    res["pass"] = ok
    with open(os.path.join(args.out, "soak.json"), "w") as f:
        json.dump(res, f, indent=1)
    lat = res["complete_latency_s"]
    print(f"SUMMARY soak {args.seconds:.0f} s x {args.clients} clients: "
          f"{sum(sum(c.values()) for c in res['counts'].values())} actions, {res['failures']} failures; "
          f"RSS {res['rss_mib']['first']} -> {res['rss_mib']['last']} MiB (slope "
          f"{res['rss_mib']['slope_mib_per_min_second_half']} MiB/min, 2nd half; floor slope "
          f"{res['rss_mib']['floor_slope_mib_per_min']} MiB/min); complete p50 "
          f"{lat['first_third']['p50']} -> {lat['last_third']['p50']} s; end {res['end']}; "
          f"{'PASS' if ok else 'FAIL'}", flush=True)
    for line in res["failure_examples"]:
        print("FAILURE", line, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
