/*
 * npumem.h: the C interface of libnpumem, npumem's device-memory allocators as a library that
 * PyTorch's CUDAPluggableAllocator and torch_npu's NPUPluggableAllocator load.
 *
 *     import torch, npumem
 *     a = torch.cuda.memory.CUDAPluggableAllocator(npumem.capi.library_path(), "npumem_malloc", "npumem_free")
 *     torch.cuda.memory.change_current_allocator(a)
 *
 * (torch_npu: torch_npu.npu.NPUPluggableAllocator(...) and torch_npu.npu.memory.change_current_allocator(a).)
 *
 * Configuration: read from the environment once, at the first call.
 *   NPUMEM_BACKEND    "host" (default): real host memory, pointers can be dereferenced (by
 *                     the CPU; a GPU or NPU kernel only where the platform shares host memory
 *                     with the device).
 *                     "sim": the simulated device, for testing allocation patterns only; its
 *                     pointers are simulated addresses and MUST NOT be dereferenced.
 *                     "acl", "cuda": device memory of AscendCL (libascendcl.so: NPUMEM_ACL_LIB,
 *                     else $ASCEND_HOME_PATH/lib64, else the loader path) or of the CUDA driver
 *                     (libcuda.so.1: NPUMEM_CUDA_LIB, else the loader path); the device index
 *                     is the runtime's device.
 *   NPUMEM_ALLOCATOR  "npumem" (default), "pytorch", "torch_npu" or "direct".
 *   NPUMEM_ALLOC_CONF the allocator's settings, in the PYTORCH_NPU_ALLOC_CONF grammar
 *                     ("max_split_size_mb:128,garbage_collection_threshold:0.8,...").
 *   NPUMEM_CAPACITY   the most each device may hold, a size such as "8GiB"; default: the
 *                     memory available when the device is created (host), 32 GiB (sim),
 *                     the device's memory (acl, cuda).
 * An empty variable counts as unset. A bad value makes every call that needs a device fail,
 * with a last error naming the variable.
 *
 * Devices: indices 0 .. NPUMEM_MAX_DEVICES-1, each created on first use (or by npumem_init).
 * On the host backend every device draws on the same host memory.
 *
 * Threads: every function may be called from any thread. Each device has its own lock: calls
 * on one device are serialised, calls on different devices run in parallel.
 *
 * Errors: no function aborts the process or lets a panic escape. A call that fails does
 * nothing, returns NULL (npumem_malloc) or an error code (npumem_get_device_stats), and
 * leaves the reason in the calling thread's last error (npumem_last_error). Every call but
 * npumem_last_error and npumem_last_error_code clears the thread's last error first, so after a
 * call npumem_last_error() is NULL exactly when that call succeeded.
 *
 * Streams: `stream` is a handle (a cudaStream_t, an aclrtStream); npumem maps each distinct
 * value to a stream of its own on first sight (at most 65536 per device); NULL is the default
 * stream. On the host and sim backends npumem sees no work on these streams: a free takes
 * effect when npumem_free returns, and the block may be handed out again to any stream. The
 * caller frees a block only once the work that uses it is done or ordered before the next user
 * (as PyTorch does when it calls the free function from its deleter). On the acl and cuda
 * backends (NPUMEM_BACKEND=acl|cuda) the handle must be a stream of that runtime: a free records
 * the runtime's event on the freeing stream (and on streams added with npumem_record_stream);
 * the same stream reuses the block at once, another stream only once that event has completed.
 */
#ifndef NPUMEM_H
#define NPUMEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#ifdef __cplusplus
extern "C" {
#endif

/* Device indices accepted: 0 .. NPUMEM_MAX_DEVICES - 1. */
#define NPUMEM_MAX_DEVICES 64

/* AscendCL error codes (aclError) that npumem_last_error_code() returns. */
#define NPUMEM_ACL_ERROR_INVALID_PARAM 100000
#define NPUMEM_ACL_ERROR_RT_PARAM_INVALID 107000
#define NPUMEM_ACL_ERROR_RT_ADDR_UNALIGNED 107008
#define NPUMEM_ACL_ERROR_RT_INVALID_HANDLE 107017
#define NPUMEM_ACL_ERROR_FEATURE_UNSUPPORTED 200006
#define NPUMEM_ACL_ERROR_RT_MEMORY_ALLOCATION 207001
#define NPUMEM_ACL_ERROR_RT_MEMORY_FREE 207002
#define NPUMEM_ACL_ERROR_RT_DRV_INTERNAL_ERROR 507899

/*
 * Allocates `size` bytes on `device` for work on `stream` (NULL: the default stream), as
 * aclrtMallocAlign32 with ACL_MEM_MALLOC_HUGE_FIRST: the block starts on a 64-byte boundary and
 * blocks above 1 MiB get 2 MiB pages where the allocator can. Returns NULL on failure (negative
 * size, bad device index, out of memory, bad configuration: see npumem_last_error), and NULL
 * without an error for size 0. The signature PyTorch's CUDAPluggableAllocator and torch_npu's
 * NPUPluggableAllocator load as their alloc function.
 */
void* npumem_malloc(ssize_t size, int device, void* stream);

/*
 * Frees `ptr`, which npumem_malloc returned for `size` bytes on `device`, ordered on `stream`.
 * NULL is a no-op (whatever `size`). A `size` other than the one allocated, a `device` that
 * does not hold `ptr`, a pointer that is not live (never allocated, already freed, or inside
 * a block) is an error: nothing is freed and the last error says which. The signature the
 * pluggable allocators load as their free function (they pass back the size they asked for).
 */
void npumem_free(void* ptr, ssize_t size, int device, void* stream);

/*
 * Records that `stream` also uses the live block `ptr` (set_record_stream_fn of PyTorch's
 * CUDAPluggableAllocator). NULL is a no-op; a pointer that is not live is an error.
 * (torch_npu's set_record_stream_fn passes a C++ NPUStream object, not an aclrtStream, so do
 * not register this function there.)
 */
void npumem_record_stream(void* ptr, void* stream);

/*
 * Reads the configuration and creates devices 0 .. device_count-1, so that a bad configuration
 * shows at once (set_init_fn; PyTorch passes its device count). Optional: devices are also
 * created on first use. device_count must be in 0 .. NPUMEM_MAX_DEVICES.
 */
void npumem_init(int device_count);

/* Returns every device's cached, unused memory to the system (PyTorch's set_reset_fn). */
void npumem_empty_cache(void);

/* The same as npumem_empty_cache, with torch_npu's reset signature (set_reset_fn, void(bool)). */
void npumem_reset(bool check_error);

/*
 * Caps what `device`'s allocator may hold at `fraction` (0 to 1) of its capacity
 * (set_memory_fraction_fn; torch.cuda.set_per_process_memory_fraction).
 */
void npumem_set_memory_fraction(double fraction, int device);

/*
 * Statistics, in PyTorch's scheme: npumem_device_stats_t (NPUMEM_DEVICE_STATS_VERSION 2) has
 * one field for each plain field of torch 2.15's c10::CachingDeviceAllocator::DeviceStats, with
 * the same name and type and in the same order (a Stat is four int64_t; a StatArray is three
 * Stats indexed by NPUMEM_STAT_ALL / _SMALL_POOL / _LARGE_POOL), then npumem's own figures.
 * Torch's reserved_bytes_by_private_pools (a hash map) has no C form; npumem has no private
 * pools, so it stays empty. The layouts differ (torch's map sits between reserved_bytes and
 * active_bytes): copy field by field, as NPUMEM_TORCH_DEVICE_STATS below does. torch.cuda.memory_stats() key
 * "<field>.<all|small_pool|large_pool>.<current|peak|allocated|freed>" is
 * stats.<field>[index].<current|peak|allocated|freed>; e.g. memory_allocated() is
 * stats.allocated_bytes[NPUMEM_STAT_ALL].current and memory_reserved() is
 * stats.reserved_bytes[NPUMEM_STAT_ALL].current. torch_npu's set_get_device_stats_fn takes a
 * C++ function returning its DeviceStats by value, a type whose fields vary between torch_npu
 * versions: a few lines of C++ that call npumem_get_device_stats and copy the fields over
 * bridge the two.
 */
#define NPUMEM_DEVICE_STATS_VERSION 2 /* torch 2.15's DeviceStats */
#define NPUMEM_STAT_ALL 0
#define NPUMEM_STAT_SMALL_POOL 1 /* blocks of up to 1 MiB */
#define NPUMEM_STAT_LARGE_POOL 2

typedef struct npumem_stat {
    int64_t current;
    int64_t peak;      /* highest `current` since start or the last npumem_reset_peak_stats */
    int64_t allocated; /* total increases */
    int64_t freed;     /* total decreases */
} npumem_stat_t;

typedef struct npumem_device_stats {
    npumem_stat_t allocation[3];           /* live blocks */
    npumem_stat_t segment[3];              /* segments obtained from the device */
    npumem_stat_t active[3];               /* blocks in use */
    npumem_stat_t inactive_split[3];       /* free blocks inside partly used segments */
    npumem_stat_t allocated_bytes[3];      /* bytes in live blocks */
    npumem_stat_t reserved_bytes[3];       /* bytes held from the device, used or cached */
    npumem_stat_t active_bytes[3];
    npumem_stat_t inactive_split_bytes[3];
    npumem_stat_t requested_bytes[3];      /* bytes the callers asked for */
    int64_t num_alloc_retries;
    int64_t num_ooms;
    npumem_stat_t oversize_allocations;
    npumem_stat_t oversize_segments;
    int64_t num_sync_all_streams;
    int64_t num_device_alloc;
    int64_t num_device_free;
    int64_t num_oom_rejections;            /* 0: npumem has no OOM preemption policy */
    int64_t max_split_size;                /* -1: blocks of every size may be split */
    /* npumem's own figures (not in PyTorch's DeviceStats): */
    int64_t num_cache_misses;              /* mallocs that needed new device memory */
} npumem_device_stats_t;

/*
 * Fills *out with `device`'s statistics; pass out_size = sizeof(npumem_device_stats_t) (a
 * header that does not match the library is refused). Returns 0, or an error code (also in
 * the last error).
 */
int npumem_get_device_stats(int device, npumem_device_stats_t* out, size_t out_size);

/*
 * Resets the peaks of `device`'s statistics (torch_npu's set_reset_peak_status_fn, whose hook is
 * void(c10::DeviceIndex): int8_t).
 */
void npumem_reset_peak_stats(int8_t device);

/*
 * Why the calling thread's last npumem call failed ("npumem_free(ptr=0x..., size=..., device=0,
 * stream=0x0): ACL_ERROR_RT_MEMORY_FREE (207002): double free: ..."), or NULL if it succeeded.
 * The string belongs to the library and stays valid until the thread's next npumem call (other
 * than npumem_last_error and npumem_last_error_code).
 */
const char* npumem_last_error(void);

/* The AscendCL code (NPUMEM_ACL_ERROR_*) of the calling thread's last failed call, or 0. */
int npumem_last_error_code(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#if defined(__cplusplus) && defined(NPUMEM_TORCH_DEVICE_STATS)
#include <c10/core/CachingDeviceAllocator.h>
/*
 * Torch's DeviceStats from npumem's, field by field (define NPUMEM_TORCH_DEVICE_STATS before
 * including this header, with torch's include directory on the path): what a hook that must
 * return torch's struct (torch_npu's set_get_device_stats_fn) returns.
 */
inline c10::CachingDeviceAllocator::DeviceStats npumem_torch_device_stats(const npumem_device_stats_t& s) {
    c10::CachingDeviceAllocator::DeviceStats t;
    auto stat = [](c10::CachingAllocator::Stat& to, const npumem_stat_t& from) {
        to.current = from.current;
        to.peak = from.peak;
        to.allocated = from.allocated;
        to.freed = from.freed;
    };
    auto array = [&](c10::CachingAllocator::StatArray& to, const npumem_stat_t (&from)[3]) {
        for (int i = 0; i < 3; i++) stat(to[i], from[i]);
    };
    array(t.allocation, s.allocation);
    array(t.segment, s.segment);
    array(t.active, s.active);
    array(t.inactive_split, s.inactive_split);
    array(t.allocated_bytes, s.allocated_bytes);
    array(t.reserved_bytes, s.reserved_bytes);
    array(t.active_bytes, s.active_bytes);
    array(t.inactive_split_bytes, s.inactive_split_bytes);
    array(t.requested_bytes, s.requested_bytes);
    t.num_alloc_retries = s.num_alloc_retries;
    t.num_ooms = s.num_ooms;
    stat(t.oversize_allocations, s.oversize_allocations);
    stat(t.oversize_segments, s.oversize_segments);
    t.num_sync_all_streams = s.num_sync_all_streams;
    t.num_device_alloc = s.num_device_alloc;
    t.num_device_free = s.num_device_free;
    t.num_oom_rejections = s.num_oom_rejections;
    t.max_split_size = s.max_split_size;
    return t;
}
#endif

#endif /* NPUMEM_H */
