"""Triton's file cache for a sandboxed subject (named in its environment as TRITON_CACHE_MANAGER).

Triton's own cache writes each file in a fresh subdirectory and renames it up into place. Moving a file into another
directory needs Landlock's "refer" right, which a kernel with Landlock ABI 1 (Linux 5.13-5.18) cannot grant: there the
rename fails with EXDEV ("Invalid cross-device link") and a Triton candidate raises at its first launch. This one
writes each file beside its final name (proc.scratch.write_beside), as atomic as Triton's."""

from __future__ import annotations

from triton.runtime.cache import FileCacheManager

from musacoder.proc.scratch import write_beside


class BesideCacheManager(FileCacheManager):
    def put(self, data, filename, binary=True) -> str:
        if not self.cache_dir:
            raise RuntimeError("Could not create or locate cache dir")
        return write_beside(self._make_path(filename), data if isinstance(data, bytes) else str(data))
