"""The pyACL layer's cost per call, beside the same work on a Device directly (ratios: both are
measured in the same run), and a P2P copy's time on the simulated clock.

1. malloc + free of 1 KiB: ``acl.rt`` (current context, argument parsing, the books of the leak
   report, the call site) against ``Device.malloc``/``free``.
2. memcpy of 4 KiB host to device: from pinned (``malloc_host``) and from pageable memory (a
   numpy array) against ``Device.memcpy`` / ``Device.write``.
3. A device-to-device copy between two devices after ``device_enable_peer_access``: simulated
   GB/s against the cost model's P2P bandwidth.

Run: make bench B=pyacl   (or: .venv/bin/python benches/bench_pyacl.py)
"""

from __future__ import annotations

import numpy as np

import npumem
import npumem.acl as acl
from npumem._timing import per_call

#: Calls per timing round (the best of 5 rounds is kept).
N = 20_000


def main() -> None:
    acl.configure(devices=2, capacity="4GiB")
    acl.init()
    acl.rt.set_device(0)
    dev = npumem.Device("4GiB")
    n = 4096
    rows = []

    def acl_pair() -> None:
        acl.rt.free(acl.rt.malloc(1024, 0)[0])

    def dev_pair() -> None:
        dev.free(dev.malloc(1024, 0))

    rows.append(("malloc + free 1 KiB", per_call(acl_pair, N), per_call(dev_pair, N)))

    a_dev, _ = acl.rt.malloc(n, 0)
    a_host, _ = acl.rt.malloc_host(n)
    d_dev, d_host = dev.malloc(n), dev.malloc_host(n)
    page = np.zeros(n, np.uint8)
    pp = page.ctypes.data
    rows.append(
        (
            "memcpy 4 KiB H2D, pinned",
            per_call(lambda: acl.rt.memcpy(a_dev, n, a_host, n, 1), N),
            per_call(lambda: dev.memcpy(d_dev, n, d_host, n, 1), N),
        )
    )
    rows.append(
        (
            "memcpy 4 KiB H2D, pageable",
            per_call(lambda: acl.rt.memcpy(a_dev, n, pp, n, 1), N),
            per_call(lambda: dev.write(d_dev, page), N),
        )
    )
    print(f"{'call':<28}{'acl.rt us':>11}{'Device us':>11}{'ratio':>8}")
    for name, a, d in rows:
        print(f"{name:<28}{a * 1e6:11.2f}{d * 1e6:11.2f}{a / d:8.1f}")

    size = 256 << 20
    acl.rt.set_device(1)
    dst, _ = acl.rt.malloc(size, 0)
    acl.rt.set_device(0)
    src, _ = acl.rt.malloc(size, 0)
    acl.rt.device_enable_peer_access(1, 0)
    stream, _ = acl.rt.create_stream()
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    acl.rt.record_event(start, stream)
    acl.rt.memcpy_async(dst, size, src, size, 3, stream)
    acl.rt.record_event(end, stream)
    acl.rt.synchronize_stream(stream)
    ms, _ = acl.rt.event_elapsed_time(start, end)
    link = npumem.Device("64MiB").cost_model()["p2p_bandwidth"] / 1e9
    print(
        f"\nP2P copy of 256 MiB, device 0 -> 1: {ms:.3f} ms simulated, "
        f"{size / ms / 1e6:.1f} GB/s (link {link:.0f} GB/s)"
    )
    for e in (start, end):
        acl.rt.destroy_event(e)
    acl.rt.destroy_stream(stream)
    acl.rt.free(src)
    acl.rt.free(dst)
    acl.rt.free(a_dev)
    acl.rt.free_host(a_host)
    acl.finalize()


if __name__ == "__main__":
    main()
