"""Async copies with DVPP buffers on a stream, timed with events, as pyACL programs do.

python -m npumem.run examples/pyacl/dvpp_async.py
"""

import acl
import numpy as np

ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
NPY_UINT8 = 2


def check_ret(message, ret):
    if ret != 0:
        raise Exception(f"{message} failed ret={ret}")


def main():
    check_ret("acl.init", acl.init())
    check_ret("acl.rt.set_device", acl.rt.set_device(0))
    stream, ret = acl.rt.create_stream()
    check_ret("acl.rt.create_stream", ret)
    start, ret = acl.rt.create_event()
    check_ret("acl.rt.create_event", ret)
    end, ret = acl.rt.create_event()
    check_ret("acl.rt.create_event", ret)

    # A 1080p YUV420SP frame.
    width, height = 1920, 1080
    size = width * height * 3 // 2
    host_ptr, ret = acl.rt.malloc_host(size)
    check_ret("acl.rt.malloc_host", ret)
    frame = acl.util.ptr_to_numpy(host_ptr, (size,), NPY_UINT8)
    frame[:] = np.arange(size, dtype=np.uint64).astype(np.uint8)

    dvpp_in, ret = acl.media.dvpp_malloc(size)
    check_ret("acl.media.dvpp_malloc", ret)
    dvpp_out, ret = acl.media.dvpp_malloc(size)
    check_ret("acl.media.dvpp_malloc", ret)
    assert dvpp_in % 128 == 0 and dvpp_out % 128 == 0

    check_ret("acl.rt.record_event", acl.rt.record_event(start, stream))
    # From pinned memory: queued on the stream.
    check_ret("H2D", acl.rt.memcpy_async(dvpp_in, size, host_ptr, size, ACL_MEMCPY_HOST_TO_DEVICE, stream))
    check_ret("D2D", acl.rt.memcpy_async(dvpp_out, size, dvpp_in, size, 3, stream))
    check_ret("acl.rt.record_event", acl.rt.record_event(end, stream))
    status, ret = acl.rt.query_event(end)
    check_ret("acl.rt.query_event", ret)
    print("copies queued; event status", "complete" if status == 0 else "not ready")
    check_ret("acl.rt.synchronize_stream", acl.rt.synchronize_stream(stream))
    ms, ret = acl.rt.event_elapsed_time(start, end)
    check_ret("acl.rt.event_elapsed_time", ret)
    print(f"H2D + D2D of {size} bytes took {ms:.3f} ms on the device")

    # Into pageable memory (a numpy array): the async copy completes before it returns.
    result = np.zeros(size, dtype=np.uint8)
    ptr, result = acl.util.numpy_contiguous_to_ptr(result)
    check_ret("D2H", acl.rt.memcpy_async(ptr, size, dvpp_out, size, ACL_MEMCPY_DEVICE_TO_HOST, stream))
    assert np.array_equal(result, frame), "the frame changed on its way"
    print("frame round trip: ok")

    check_ret("acl.media.dvpp_free", acl.media.dvpp_free(dvpp_in))
    check_ret("acl.media.dvpp_free", acl.media.dvpp_free(dvpp_out))
    check_ret("acl.rt.free_host", acl.rt.free_host(host_ptr))
    for event in (start, end):
        check_ret("acl.rt.destroy_event", acl.rt.destroy_event(event))
    check_ret("acl.rt.destroy_stream", acl.rt.destroy_stream(stream))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(0))
    check_ret("acl.finalize", acl.finalize())


if __name__ == "__main__":
    main()
