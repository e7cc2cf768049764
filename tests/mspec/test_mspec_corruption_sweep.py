"""Single-byte corruption sweep: every header, directory and payload byte of the sample file.

Every corrupted file must be rejected with a *named* MspecError subclass (payload corruption in
verify mode). The figures are printed to the terminal and recorded in
KNOWLEDGE/findings/mspec-robustness.md.
"""

from __future__ import annotations

import random
from collections import Counter

from modeld.mspec import errors as E
from modeld.mspec import format as F
from modeld.mspec import open_mspec


def _reject_name(path, data: bytes | None, verify: bool) -> str | None:
    if data is not None:
        path.write_bytes(data)
    try:
        with open_mspec(path, verify=verify):
            return None
    except E.MspecError as err:
        assert type(err) is not E.MspecError, "errors must be named subclasses"
        return type(err).__name__


def test_every_header_and_directory_byte_and_sampled_payload_bytes(sample_bytes, tmp_path, capsys):
    _, _, header = F.unpack_header(sample_bytes[:F.HEADER_SIZE])
    front = header.payload_offset                    # header + directory + zero padding
    path = tmp_path / "c.mspec"
    path.write_bytes(sample_bytes)
    seen: Counter = Counter()
    accepted: list[int] = []
    rng = random.Random(1234)

    def flip(pos: int, verify: bool) -> None:
        # Corrupt one byte in place, check, restore: one 1-byte write per case instead of a file.
        with open(path, "r+b") as f:
            f.seek(pos)
            f.write(bytes([sample_bytes[pos] ^ rng.randint(1, 255)]))
        name = _reject_name(path, None, verify)
        with open(path, "r+b") as f:
            f.seek(pos)
            f.write(sample_bytes[pos:pos + 1])
        if name is None:
            accepted.append(pos)
        seen[name] += 1

    for pos in range(front):
        flip(pos, verify=False)
    # The sample payload is small (every dtype, ~5.6 KB), so "sampled" is every payload byte.
    payload_positions = range(front, len(sample_bytes))
    for pos in payload_positions:
        flip(pos, verify=True)
    assert path.read_bytes() == sample_bytes
    total = front + len(payload_positions)
    with capsys.disabled():
        print(f"\n[mspec corruption sweep] header+directory bytes swept: {front} (all), payload bytes "
              f"swept in verify mode: {len(payload_positions)} (all); rejected "
              f"{total - len(accepted)}/{total} = {100 * (total - len(accepted)) / total:.1f}% "
              f"with named errors {dict(sorted((k, v) for k, v in seen.items() if k))}")
    assert not accepted, f"corruptions accepted at byte offsets {accepted[:20]}"


def test_every_truncation_and_any_extension_is_rejected(sample_bytes, tmp_path):
    path = tmp_path / "t.mspec"
    step = max(1, len(sample_bytes) // 512)
    for cut in list(range(0, len(sample_bytes), step)) + [len(sample_bytes) - 1]:
        assert _reject_name(path, sample_bytes[:cut], verify=False) in (
            "MspecTruncated", "MspecBadMagic"), cut
    for extra in (b"\0", b"\0" * 256, b"x"):
        assert _reject_name(path, sample_bytes + extra, verify=False) == "MspecTrailingBytes"
