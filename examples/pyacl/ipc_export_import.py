"""IPC memory sharing: device 0 exports a buffer, device 1 imports it by key, writes into it,
and both sides close in the documented order (importer first, then exporter, then free).

python -m npumem.run examples/pyacl/ipc_export_import.py
"""

import threading

import acl
import numpy as np

ACL_MEM_MALLOC_HUGE_FIRST = 0
ACL_MEMCPY_HOST_TO_DEVICE = 1
ACL_MEMCPY_DEVICE_TO_HOST = 2
ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS = 1
KEY_LEN = 65


def check_ret(message, ret):
    if ret != 0:
        raise Exception(f"{message} failed ret={ret}")


def importer(key, size, done):
    """Another worker, with device 1 current in its thread."""
    check_ret("acl.rt.set_device", acl.rt.set_device(1))
    ptr, ret = acl.rt.ipc_mem_import_by_key(key, ACL_RT_IPC_MEM_IMPORT_FLAG_ENABLE_PEER_ACCESS)
    check_ret("acl.rt.ipc_mem_import_by_key", ret)
    message = np.frombuffer(b"written by the importer on device 1".ljust(size, b"."), dtype=np.uint8)
    check_ret("H2D", acl.rt.memcpy(ptr, size, message.ctypes.data, size, ACL_MEMCPY_HOST_TO_DEVICE))
    check_ret("acl.rt.ipc_mem_close", acl.rt.ipc_mem_close(key))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(1))
    done.set()


def main():
    check_ret("acl.init", acl.init())
    check_ret("acl.rt.set_device", acl.rt.set_device(0))
    size = 2 * 1024 * 1024  # whole huge pages: exported memory must be page-table aligned
    buf, ret = acl.rt.malloc(size, ACL_MEM_MALLOC_HUGE_FIRST)
    check_ret("acl.rt.malloc", ret)
    key, ret = acl.rt.ipc_mem_get_export_key(buf, size, KEY_LEN, 0)
    check_ret("acl.rt.ipc_mem_get_export_key", ret)
    pid, ret = acl.rt.device_get_bare_tgid()
    check_ret("acl.rt.device_get_bare_tgid", ret)
    check_ret("acl.rt.ipc_mem_set_import_pid", acl.rt.ipc_mem_set_import_pid(key, [pid]))
    print(f"exported {size >> 20} MiB on device 0 as {key}")

    done = threading.Event()
    worker = threading.Thread(target=importer, args=(key, 64, done))
    worker.start()
    worker.join()
    assert done.is_set(), "the importer failed"

    out = bytes(64)
    check_ret("D2H", acl.rt.memcpy(acl.util.bytes_to_ptr(out), 64, buf, 64, ACL_MEMCPY_DEVICE_TO_HOST))
    print("exporter reads:", out.rstrip(b".").decode())
    assert out.startswith(b"written by the importer")

    check_ret("acl.rt.ipc_mem_close", acl.rt.ipc_mem_close(key))
    check_ret("acl.rt.free", acl.rt.free(buf))
    check_ret("acl.rt.reset_device", acl.rt.reset_device(0))
    check_ret("acl.finalize", acl.finalize())


if __name__ == "__main__":
    main()
