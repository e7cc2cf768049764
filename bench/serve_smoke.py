"""`modeld resolve` + `modeld serve` on this host, exercised over real HTTP: the serving smoke.

Runs what a user runs, as subprocesses of the installed code (`python3 -m modeld ...`):
1. `modeld resolve MODEL --json` — which cell this host picks, and why the others were rejected;
2. `modeld serve --model MODEL` on a loopback port, waits for /healthz (the model loads at start);
3. over HTTP (httpx): /v1/models; a greedy /v1/completions (non-streamed) and the same request
   streamed (SSE) — their texts must agree; a chat completion when the model has a chat template;
   the session API (create → ensure_prefix → streamed decode → snapshot → decode; a second
   session restores the snapshot and must decode the same tokens); a malformed request (must get
   a JSON error, the server must keep serving); /metrics (our counters present);
4. stops the server (SIGINT, then SIGTERM) and records its exit and stderr tail; the server's
   resident memory (VmRSS, peak VmHWM) is read from /proc after load and before the stop.

Every step is timed (client side) and checked; the result is one JSON file. Exit 0 when every
check passed, 1 otherwise (the JSON says which). Needs httpx plus the server's own dependencies
(fastapi, uvicorn, pydantic: carry wheels to the H200, see KNOWLEDGE/pitfalls).

    PYTHONPATH=src:. python3 bench/serve_smoke.py --model /tmp/smol.gguf --out $OUT [--expect-cell engine_llama_smollm2]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def iter_sse(lines):
    """SSE `data:` payloads as they arrive (decoded JSON, or the string "[DONE]")."""
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            yield data if data == "[DONE]" else json.loads(data)


def sse_events(lines) -> list:
    return list(iter_sse(lines))


class Checks:
    """Collects named checks with timings; never raises on a failed check."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def run(self, name: str, fn):
        t0 = time.perf_counter()
        try:
            ok, detail = fn()
        except Exception as exc:  # a failed step is a result, not a crash of the smoke
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        row = {"check": name, "ok": bool(ok), "seconds": round(time.perf_counter() - t0, 4), "detail": detail}
        self.rows.append(row)
        print(("PASS " if ok else "FAIL ") + name + f" ({row['seconds']:.3f}s) {str(detail)[:300]}", flush=True)
        return detail

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.rows)


def modeld(*args: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "modeld", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def proc_memory(pid: int) -> dict:
    """Resident memory of the server process from /proc (Linux): VmRSS now and VmHWM (its peak), in
    MiB — the artifact is unmapped after load, so RSS should not hold the weights' file pages."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
        return {k: round(int(v.split()[0]) / 1024, 1) for k, v in fields.items()}  # kB -> MiB
    except (OSError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model name or .gguf/.mspec path, as for `modeld serve --model`")
    ap.add_argument("--out", required=True, help="output folder; writes serve_smoke[-LABEL].json")
    ap.add_argument("--label", default="", help="suffix for the output file name")
    ap.add_argument("--expect-cell", default=None, help="fail unless resolve and the server pick this cell id")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--load-timeout", type=float, default=600.0, help="seconds to wait for /healthz")
    args = ap.parse_args(argv)

    import httpx

    env = dict(os.environ)
    result: dict = {"bench": "serve_smoke", "model": args.model, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    checks = Checks()
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"serve_smoke{'-' + args.label if args.label else ''}.json")

    def save():
        result["checks"], result["pass"] = checks.rows, checks.ok
        with open(path, "w") as f:
            json.dump(result, f, indent=1)

    def resolve():
        p = modeld("resolve", args.model, "--json", env=env, timeout=300)
        result["resolve_stdout"] = p.stdout[-20000:]
        if p.returncode != 0:
            return False, f"exit {p.returncode}: {p.stderr[-2000:]}"
        decision = json.loads(p.stdout)
        result["resolve"] = decision
        chosen = decision.get("selected")
        return args.expect_cell in (None, chosen), {"selected": chosen, "fell_through": decision.get("fell_through"),
                                                    "rejections": decision.get("rejections")}

    checks.run("resolve", resolve)
    save()
    if not checks.ok:  # another cell would load (e.g. the CPU reference cell for a 27B artifact): stop here
        print(f"serve smoke FAILED at resolve -> {path}", flush=True)
        return 1

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(os.path.join(args.out, f"server{'-' + args.label if args.label else ''}.log"), "w")
    t_start = time.perf_counter()
    server = subprocess.Popen([sys.executable, "-m", "modeld", "serve", "--model", args.model, "--port", str(port),
                               "--n-ctx", str(args.n_ctx), "--log-level", "warning"], env=env, stdout=log, stderr=log,
                              start_new_session=True)
    client = httpx.Client(base_url=base, timeout=httpx.Timeout(600.0, connect=5.0))
    try:
        def healthy():
            while time.perf_counter() - t_start < args.load_timeout:
                if server.poll() is not None:
                    return False, f"server exited with {server.returncode} before it was healthy"
                try:
                    r = client.get("/healthz")
                    if r.status_code == 200:
                        return True, {"startup_s": round(time.perf_counter() - t_start, 2), "healthz": r.json()}
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            return False, "timed out waiting for /healthz"

        up = checks.run("server starts and loads the model", healthy)
        result["server_memory_after_load"] = proc_memory(server.pid)
        save()
        if not checks.ok or not isinstance(up, dict):
            return 1
        checks.run("GET /v1/models", lambda: ((r := client.get("/v1/models")).status_code == 200, r.json()))

        body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0}

        def completion():
            t0 = time.perf_counter()
            r = client.post("/v1/completions", json=body)
            j = r.json()
            dt = time.perf_counter() - t0
            n = j.get("usage", {}).get("completion_tokens", 0)
            result["completion"] = {"text": j["choices"][0]["text"], "usage": j.get("usage"), "seconds": dt,
                                    "tok_per_s_incl_prefill": n / dt if dt else None}
            return r.status_code == 200 and n > 0, result["completion"]

        checks.run("POST /v1/completions (greedy)", completion)

        def streamed():
            t0, first, texts = time.perf_counter(), None, []
            with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
                for ev in iter_sse(r.iter_lines()):  # timed as they arrive
                    if ev == "[DONE]":
                        break
                    if first is None:
                        first = time.perf_counter() - t0
                    texts.append(ev["choices"][0].get("text", ""))
            total = time.perf_counter() - t0
            text = "".join(texts)
            want = result.get("completion", {}).get("text")
            result["stream"] = {"text": text, "first_event_s": first, "total_s": total, "events": len(texts)}
            return text == want, {"same_as_non_streamed": text == want, **result["stream"]}

        checks.run("POST /v1/completions stream=true equals non-streamed", streamed)

        def sessions():
            sid = client.post("/v1/sessions", json={}).json()["id"]
            caps = client.get(f"/v1/sessions/{sid}/capabilities").json()
            result["capabilities"] = caps
            pre = client.post(f"/v1/sessions/{sid}/ensure_prefix", json={"prompt": args.prompt}).json()
            with client.stream("POST", f"/v1/sessions/{sid}/decode", json={"max_tokens": 8, "temperature": 0}) as r:
                evs = sse_events(r.iter_lines())
            snap = client.post(f"/v1/sessions/{sid}/snapshot")
            want = client.post(f"/v1/sessions/{sid}/decode", json={"max_tokens": 8, "temperature": 0, "stream": False}).json()
            other = client.post("/v1/sessions", json={}).json()["id"]
            ok = client.post(f"/v1/sessions/{other}/restore", content=snap.content,
                             headers={"content-type": "application/octet-stream"})
            got = client.post(f"/v1/sessions/{other}/decode", json={"max_tokens": 8, "temperature": 0, "stream": False}).json()
            for s in (sid, other):
                client.delete(f"/v1/sessions/{s}")
            same = ok.status_code == 200 and got.get("tokens") == want.get("tokens") and len(want.get("tokens", [])) > 0
            return same and evs[-1] == "[DONE]", {
                "cell": caps["identity"]["cell_id"], "backend": caps["identity"]["backend"],
                "profile": caps["identity"]["profile"], "prefilled": pre.get("prefilled"),
                "snapshot_bytes": len(snap.content), "restore_status": ok.status_code,
                "continuation_equal": got.get("tokens") == want.get("tokens")}

        detail = checks.run("session API: ensure_prefix, decode, snapshot -> restore continues identically", sessions)
        if args.expect_cell:
            checks.run(f"server cell is {args.expect_cell}",
                       lambda: (isinstance(detail, dict) and detail.get("cell") == args.expect_cell, detail))

        def chat():
            caps = result.get("capabilities", {})
            if not caps.get("chat_template"):
                return True, "model has no chat template: skipped"
            r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Say hi."}],
                                                          "max_tokens": 12, "temperature": 0})
            return r.status_code == 200, r.json()

        checks.run("POST /v1/chat/completions", chat)

        def malformed():
            r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": -3})
            again = client.get("/healthz")
            return r.status_code in (400, 422) and "error" in r.json() and again.status_code == 200, \
                {"status": r.status_code, "error": r.json().get("error")}

        checks.run("malformed request gets a JSON error, server keeps serving", malformed)

        def metrics():
            text = client.get("/metrics").text
            ours = [line.split(" ")[0] for line in text.splitlines() if line.startswith("modeld_")]
            return len(ours) > 0, ours[:12]

        checks.run("GET /metrics has modeld_ counters", metrics)
    finally:
        client.close()
        result["server_memory_at_end"] = proc_memory(server.pid)
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        log.close()
        result["server_exit"] = server.returncode
        result["server_log_tail"] = open(log.name).read()[-4000:]
        save()
    print(f"serve smoke {'PASSED' if checks.ok else 'FAILED'} -> {path}", flush=True)
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())
