"""A stand-in for the GPU launch of the snapshot block-hash kernel, for snapshot commands run
on the fake CUDA driver (tests/fakecuda; test_snapshot_gpuhash_path.py puts this directory on
PYTHONPATH and names the emulation's library in XXH3_EMU_LIB). gpuhash.GpuHasher's compile,
load and launch are replaced by xxh3.cu itself run on the CPU (tests/integration/xxh3_emu.py)
over the fake driver's "device" memory, which is host memory; everything else of the GPU data
path (gpumemctl/snapshots/devpath.py, staging.py) runs as it is."""
import os

if os.environ.get("XXH3_EMU_LIB"):
    import threading

    from gpumemctl.snapshots import gpuhash
    from gpumemctl.snapshots.manifest import BLOCK
    from tests.integration.xxh3_emu import Emulated

    class EmulatedHasher(gpuhash.GpuHasher):
        def __init__(self, device: int):
            self.device, self.lock = device, threading.Lock()
            self.kernel = Emulated(os.environ["XXH3_EMU_LIB"])
            self.words: list[int] = []

        def launch(self, ptr: int, size: int) -> None:
            if ptr % 8:
                raise ValueError("unaligned")
            self.words = self.kernel.words(ptr, size, BLOCK)

        def collect(self) -> list[str]:
            words, self.words = self.words, []
            return gpuhash.digests(words)

        def hash_ranges(self, ranges):      # the batching itself is tested on a GPU
            out = []
            for ptr, size in ranges:
                self.launch(ptr, size)
                out.append(self.collect())
            return out

    gpuhash.GpuHasher = EmulatedHasher
