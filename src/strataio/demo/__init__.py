"""``strataio demo``: the Astro3D pipeline of the multi-storage paper on the storage hierarchy
(:mod:`strataio.demo.astro3d` runs on the ranks, :mod:`strataio.demo.pipeline` drives it)."""
