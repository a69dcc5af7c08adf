"""The one options object; the only place environment variables are read."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Options:
    backend: str = "cpu"  # cpu: generated C++ and library GEMMs | reference: each op through torch
    cache_dir: str = ""  # compiled kernels, keyed by a content hash; "" means the default
    dump_dir: str = ""  # when set, every stage is written here (graph, TEs, plan, C++, host code)
    cxx: str = "g++"
    cxx_flags: tuple[str, ...] = (
        "-O3",
        "-march=native",
        "-fopenmp",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-fPIC",
        "-std=c++17",
    )

    @staticmethod
    def from_env(**overrides) -> Options:
        env = {
            "cache_dir": os.environ.get("SYMFUSE_CACHE_DIR", ""),
            "dump_dir": os.environ.get("SYMFUSE_DUMP_DIR", ""),
            "cxx": os.environ.get("CXX", "g++"),
        }
        env.update({k: v for k, v in overrides.items() if v is not None})
        return Options(**env)

    @property
    def kernel_cache(self) -> str:
        return self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "symfuse", "kernels")
