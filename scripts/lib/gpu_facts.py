#!/usr/bin/env python3
"""Machine facts NCCL decides the GPU path from, read from the CUDA driver API
(libcuda.so.1 through ctypes; no toolkit, no PyTorch). For machine.txt and the
part headers of scripts/gpu_run.sh. Never fails: without a driver or a GPU it
prints "unknown (<reason>)" and exits 0.

  * CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED (116): with a driver >= 11.3,
    NCCL >= 2.2x decides GPUDirect RDMA from this attribute alone
    (cudaDevAttrGPUDirectRDMASupported). 0: NCCL never hands the plugin GPU
    buffers, whatever NCCL_NET_GDR_LEVEL says.
  * CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (124): NCCL's DMA-BUF registration.
  * CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (110): GDR on
    NCCL's cuMem buffers (NCCL_CUMEM_ENABLE).
  * CU_DEVICE_ATTRIBUTE_COMPUTE_MODE (20): two ranks on one GPU need Default.
Values checked against cudarc's driver/sys bindings (the same in every CUDA
version that has them).
"""
import ctypes
import sys

ATTRS = [
    ("GPU_DIRECT_RDMA_SUPPORTED", 116),
    ("DMA_BUF_SUPPORTED", 124),
    ("GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", 110),
]
COMPUTE_MODE = 20
CC_MAJOR, CC_MINOR = 75, 76
MODES = {0: "Default", 1: "Exclusive_Thread (old)", 2: "Prohibited", 3: "Exclusive_Process"}


def main():
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return [f"cuda facts: unknown (no libcuda.so.1: {e})"]

    def call(name, *args):
        r = getattr(cu, name)(*args)
        if r != 0:
            msg = ctypes.c_char_p()
            try:
                cu.cuGetErrorString(r, ctypes.byref(msg))
            except Exception:
                pass
            text = msg.value.decode() if msg.value else "?"
            raise RuntimeError(f"{name} returned {r} ({text})")

    out = []
    try:
        call("cuInit", 0)
        ver = ctypes.c_int()
        call("cuDriverGetVersion", ctypes.byref(ver))
        n = ctypes.c_int()
        call("cuDeviceGetCount", ctypes.byref(n))
    except Exception as e:  # noqa: BLE001: any failure is a fact to print
        return [f"cuda facts: unknown ({e})"]
    v = ver.value
    out.append(f"cuda facts: driver API {v // 1000}.{v % 1000 // 10}, {n.value} device(s)")
    if n.value == 0:
        out.append("cuda facts: unknown (no CUDA device)")
    for i in range(n.value):
        try:
            dev = ctypes.c_int()
            call("cuDeviceGet", ctypes.byref(dev), i)
            name = ctypes.create_string_buffer(256)
            call("cuDeviceGetName", name, 256, dev)

            def attr(a):
                x = ctypes.c_int()
                try:
                    call("cuDeviceGetAttribute", ctypes.byref(x), a, dev)
                except Exception as e:  # noqa: BLE001
                    return f"unknown ({e})"
                return x.value

            out.append(f"cuda device {i}: {name.value.decode()} cc {attr(CC_MAJOR)}.{attr(CC_MINOR)}")
            for label, a in ATTRS:
                val = attr(a)
                note = ""
                if label == "GPU_DIRECT_RDMA_SUPPORTED" and val == 0:
                    note = "  <- NCCL (driver >= 11.3) will not give a net plugin GPU buffers (no GDR)"
                out.append(f"cuda device {i}: CU_DEVICE_ATTRIBUTE_{label} ({a}) = {val}{note}")
            mode = attr(COMPUTE_MODE)
            desc = MODES.get(mode, "?") if isinstance(mode, int) else ""
            note = "" if mode == 0 or not isinstance(mode, int) else "  <- two ranks cannot share this GPU"
            out.append(f"cuda device {i}: compute mode = {mode} {desc}{note}".rstrip())
        except Exception as e:  # noqa: BLE001
            out.append(f"cuda device {i}: unknown ({e})")
    return out


if __name__ == "__main__":
    try:
        lines = main()
    except Exception as e:  # noqa: BLE001: never fail the caller
        lines = [f"cuda facts: unknown ({type(e).__name__}: {e})"]
    print("\n".join(lines))
    sys.exit(0)
