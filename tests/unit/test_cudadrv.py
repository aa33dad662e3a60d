"""gpumemctl.cudadrv's error handling and gpumemctl.dlpack's capsules, without a GPU.

The driver functions are replaced by stand-ins returning what cuda.bindings returns, a tuple
(CUresult, *outputs), so the checking is tested exactly; the rest runs against the fake driver
in tests/integration/test_cuda_fake.py and against a real GPU in tests/gpu."""
from __future__ import annotations

import ctypes
import gc
import types

import numpy as np
import pytest

from gpumemctl import cudadrv, dlpack
from gpumemctl.cudadrv import driver as cudadrv_driver

driver = pytest.importorskip("cuda.bindings.driver")


@pytest.fixture
def fake_driver(monkeypatch):
    """cudadrv talking to a namespace of stand-in functions (and the real enums)."""
    fake = types.SimpleNamespace(CUresult=driver.CUresult,
                                 cuGetErrorString=lambda e: (driver.CUresult(0),
                                                             b"out of memory"))
    monkeypatch.setattr(cudadrv_driver, "_drv", fake)
    monkeypatch.setattr(cudadrv_driver, "_initialized", True)
    return fake


def ok(*outputs):
    return lambda *args: (driver.CUresult.CUDA_SUCCESS, *outputs)


def test_results_are_unpacked(fake_driver):
    fake_driver.cuNothing = ok()
    fake_driver.cuOne = ok(7)
    fake_driver.cuTwo = ok(1, 2)
    assert cudadrv_driver._cu("cuNothing") is None
    assert cudadrv_driver._cu("cuOne") == 7
    assert cudadrv_driver._cu("cuTwo") == (1, 2)


def test_a_failed_call_raises_its_own_typed_exception(fake_driver):
    fake_driver.cuMemCreate = lambda *a: (driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None)
    with pytest.raises(cudadrv.CudaOutOfMemory) as exc:
        cudadrv_driver._cu("cuMemCreate", 1 << 40)
    err = exc.value
    assert (err.result, err.name, err.call) == (2, "CUDA_ERROR_OUT_OF_MEMORY", "cuMemCreate")
    assert str(err) == "cuMemCreate failed with CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"
    assert isinstance(err, cudadrv.CudaError)


def test_classes_for_other_results_are_made_once_and_named_for_them(fake_driver):
    fake_driver.cuLaunch = lambda *a: (driver.CUresult.CUDA_ERROR_LAUNCH_FAILED,)
    with pytest.raises(cudadrv.CudaError) as exc:
        cudadrv_driver._cu("cuLaunch")
    cls = type(exc.value)
    assert cls.__name__ == "CudaLaunchFailed" and cls.name == "CUDA_ERROR_LAUNCH_FAILED"
    assert cudadrv.error_class("CUDA_ERROR_LAUNCH_FAILED") is cls
    assert cudadrv.error_class("CUDA_ERROR_NOT_SUPPORTED") is cudadrv.CudaNotSupported
    assert cudadrv.error_class("CUDA_ERROR_NO_DEVICE") is cudadrv.CudaNoDevice


def test_a_driver_that_cannot_load_is_cuda_unavailable(fake_driver):
    def missing(*args):
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via '
                           "system search")
    fake_driver.cuInit = missing
    with pytest.raises(cudadrv.CudaUnavailable, match="cuInit: the CUDA driver cannot be used"):
        cudadrv_driver._raw("cuInit", 0)


def test_uuid_is_formatted_like_nvidia_smi(fake_driver):
    uuid = types.SimpleNamespace(bytes=bytes(range(16)))
    fake_driver.cuDeviceGet = ok(0)
    fake_driver.cuDeviceGetUuid = ok(uuid)
    fake_driver.cuDeviceGetName = ok(b"NVIDIA H100 80GB HBM3\x00   garbage")
    assert cudadrv.device_uuid(0) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert cudadrv.device_name(0) == "NVIDIA H100 80GB HBM3"


# ---- DLPack ------------------------------------------------------------------------------
def test_an_unconsumed_capsule_releases_its_export():
    released = []
    buf = ctypes.create_string_buffer(64)
    capsule = dlpack.make_capsule(ctypes.addressof(buf), 64, dlpack.kDLCUDA, 3,
                                  readonly=True, versioned=False,
                                  on_release=lambda: released.append(1))
    before = dlpack.live_exports()
    assert "dltensor" in repr(capsule)
    del capsule
    gc.collect()
    assert released == [1] and dlpack.live_exports() == before - 1


@pytest.mark.parametrize("readonly", [True, False])
def test_numpy_consumes_a_host_capsule_and_honours_read_only(readonly):
    released = []
    buf = ctypes.create_string_buffer(b"abcdefgh", 8)

    class Owner:
        def __dlpack_device__(self):
            return dlpack.kDLCPU, 0

        def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
            return dlpack.make_capsule(ctypes.addressof(buf), 8, dlpack.kDLCPU, 0,
                                       readonly=readonly, versioned=max_version is not None,
                                       on_release=lambda: released.append(1))

    arr = np.from_dlpack(Owner())
    assert arr.tobytes() == b"abcdefgh" and arr.dtype == np.uint8
    assert arr.flags.writeable is (not readonly)
    del arr
    gc.collect()
    assert released == [1]
