"""Memory management with host/device copies, written as pyACL samples are.

Run it on npumem's simulated devices, unchanged:  python -m npumem.run examples/pyacl/memory_copy.py
"""

import acl
import numpy as np

# pyACL exports no constants: programs define their own.
ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_MEMCPY_DEVICE_TO_DEVICE = 3
ACL_HBM_MEM = 1
NPY_FLOAT32 = 11


def check_ret(message, ret):
    if ret != 0:
        raise Exception(f"{message} failed ret={ret}")


def main():
    device_id = 0
    check_ret("acl.init", acl.init())
    check_ret("acl.rt.set_device", acl.rt.set_device(device_id))
    context, ret = acl.rt.create_context(device_id)
    check_ret("acl.rt.create_context", ret)

    free, total, ret = acl.rt.get_mem_info(ACL_HBM_MEM)
    check_ret("acl.rt.get_mem_info", ret)
    print(f"device {device_id}: {free >> 20} MiB free of {total >> 20} MiB")

    size = 1024 * 4
    data = np.arange(1024, dtype=np.float32)

    # Pinned host memory: ctypes-style access works on it because it is real process memory.
    host_ptr, ret = acl.rt.malloc_host(size)
    check_ret("acl.rt.malloc_host", ret)
    check_ret("acl.rt.memset", acl.rt.memset(host_ptr, size, 0, size))
    host_array = acl.util.ptr_to_numpy(host_ptr, (1024,), NPY_FLOAT32)
    host_array[:] = data

    dev_a, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check_ret("acl.rt.malloc", ret)
    dev_b, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check_ret("acl.rt.malloc", ret)

    check_ret("H2D", acl.rt.memcpy(dev_a, size, host_ptr, size, ACL_MEMCPY_HOST_TO_DEVICE))
    check_ret("D2D", acl.rt.memcpy(dev_b, size, dev_a, size, ACL_MEMCPY_DEVICE_TO_DEVICE))

    # Back into a bytes object, through bytes_to_ptr (the pointer is inside the bytes).
    if "bytes_to_ptr" in dir(acl.util):
        out = bytes(size)
        out_ptr = acl.util.bytes_to_ptr(out)
    else:
        out = np.zeros(1024, dtype=np.float32)
        out_ptr = acl.util.numpy_to_ptr(out)
    check_ret("D2H", acl.rt.memcpy(out_ptr, size, dev_b, size, ACL_MEMCPY_DEVICE_TO_HOST))
    result = np.frombuffer(out, dtype=np.float32)
    assert np.array_equal(result, data), "round trip changed the data"
    print(f"round trip of {size} bytes: ok, sum={result.sum():.0f}")

    check_ret("acl.rt.free", acl.rt.free(dev_a))
    check_ret("acl.rt.free", acl.rt.free(dev_b))
    check_ret("acl.rt.free_host", acl.rt.free_host(host_ptr))
    check_ret("acl.rt.destroy_context", acl.rt.destroy_context(context))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(device_id))
    check_ret("acl.finalize", acl.finalize())


if __name__ == "__main__":
    main()
