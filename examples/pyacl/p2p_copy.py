"""A device-to-device copy between two devices after enabling peer access.

python -m npumem.run examples/pyacl/p2p_copy.py
"""

import acl
import numpy as np

ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3


def check_ret(message, ret):
    if ret != 0:
        raise Exception(f"{message} failed ret={ret}")


def main():
    check_ret("acl.init", acl.init())
    count, ret = acl.rt.get_device_count()
    check_ret("acl.rt.get_device_count", ret)
    if count < 2:
        raise Exception("this sample needs two devices")
    src_dev, dst_dev = 0, 1
    size = 64 * 1024 * 1024

    check_ret("acl.rt.set_device", acl.rt.set_device(src_dev))
    src, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check_ret("acl.rt.malloc", ret)
    data = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
    check_ret("H2D", acl.rt.memcpy(src, size, data.ctypes.data, size, ACL_MEMCPY_HOST_TO_DEVICE))

    check_ret("acl.rt.set_device", acl.rt.set_device(dst_dev))
    can, ret = acl.rt.device_can_access_peer(dst_dev, src_dev)
    check_ret("acl.rt.device_can_access_peer", ret)
    if not can:
        raise Exception(f"device {dst_dev} cannot access device {src_dev}")
    check_ret("acl.rt.device_enable_peer_access", acl.rt.device_enable_peer_access(src_dev, 0))
    dst, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check_ret("acl.rt.malloc", ret)
    attrs, ret = acl.rt.pointer_get_attributes(src)
    check_ret("acl.rt.pointer_get_attributes", ret)
    print(f"source buffer lives on device {attrs['location']['id']}")

    stream, ret = acl.rt.create_stream()
    check_ret("acl.rt.create_stream", ret)
    start, _ = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    check_ret("acl.rt.record_event", acl.rt.record_event(start, stream))
    check_ret("P2P", acl.rt.memcpy_async(dst, size, src, size, ACL_MEMCPY_DEVICE_TO_DEVICE, stream))
    check_ret("acl.rt.record_event", acl.rt.record_event(end, stream))
    check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(stream))
    ms, ret = acl.rt.event_elapsed_time(start, end)
    check_ret("acl.rt.event_elapsed_time", ret)
    print(f"P2P copy of {size >> 20} MiB: {ms:.3f} ms ({size / ms / 1e6:.1f} GB/s)")

    out = np.zeros(size, dtype=np.uint8)
    check_ret("D2H", acl.rt.memcpy(out.ctypes.data, size, dst, size, ACL_MEMCPY_DEVICE_TO_HOST))
    assert np.array_equal(out, data), "the P2P copy changed the data"
    print("P2P copy: ok")

    acl.rt.destroy_event(start)
    acl.rt.destroy_event(end)
    check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(stream))
    check_ret("acl.rt.free", acl.rt.free(dst))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(dst_dev))
    check_ret("acl.rt.set_device", acl.rt.set_device(src_dev))
    check_ret("acl.rt.free", acl.rt.free(src))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(src_dev))
    check_ret("acl.finalize", acl.finalize())


if __name__ == "__main__":
    main()
