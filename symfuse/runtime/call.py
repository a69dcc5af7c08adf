"""Calling a kernel of a built library from the host code, with less overhead than ctypes.

A ctypes call converts each argument through its `argtypes` and costs about 0.8 us with
eight arguments; bert-small at one sentence of 16 tokens makes 35 of them a call. Every
kernel symfuse generates takes only pointers and 64-bit integers, which every 64-bit ABI
passes alike, so one small CPython extension calls them all: `Kernel(address, arity)` is a
callable that reads its arguments as integers (None is a null pointer), releases the GIL as
ctypes does, and calls the function, at about a fifth of the cost. The extension is built
once per Python and compiler into the kernel cache; where it cannot be (no Python headers,
no compiler), the host code calls through ctypes as before.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sysconfig

MAX_ARGS = 24  # kernels with more arguments are called through ctypes

_ARITIES = "\n".join(  # case n: the function as one of n int64_t parameters, called with a[0..n)
    f"    case {n}: ((void (*)({', '.join(['int64_t'] * n) or 'void'}))fn)"
    f"({', '.join(f'a[{i}]' for i in range(n))}); break;"
    for n in range(MAX_ARGS + 1)
)

SOURCE = r"""
// symfuse's kernel caller (symfuse/runtime/call.py): Kernel(address, arity)(*ints)
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cstddef>
#include <cstdint>

namespace {
struct Kernel {
  PyObject_HEAD
  void* fn;
  Py_ssize_t arity;
  vectorcallfunc vectorcall;
};

void invoke(void* fn, Py_ssize_t n, const int64_t* a) {
  switch (n) {
@ARITIES@
  }
}

PyObject* kernel_call(PyObject* self_, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Kernel* self = reinterpret_cast<Kernel*>(self_);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || n != self->arity) {
    PyErr_Format(PyExc_TypeError, "a symfuse kernel of %zd arguments was called with %zd", self->arity, n);
    return nullptr;
  }
  int64_t a[@MAX@];
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (args[i] == Py_None) {
      a[i] = 0;
      continue;
    }
    a[i] = PyLong_AsLongLong(args[i]);
    if (a[i] == -1 && PyErr_Occurred()) return nullptr;
  }
  void* fn = self->fn;
  Py_BEGIN_ALLOW_THREADS
  invoke(fn, n, a);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* kernel_new(PyTypeObject* type, PyObject* args, PyObject*) {
  unsigned long long address;
  Py_ssize_t arity;
  if (!PyArg_ParseTuple(args, "Kn", &address, &arity)) return nullptr;
  if (arity < 0 || arity > @MAX@) return PyErr_Format(PyExc_ValueError, "a kernel takes 0 to @MAX@ arguments");
  Kernel* self = reinterpret_cast<Kernel*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->fn = reinterpret_cast<void*>(address);
  self->arity = arity;
  self->vectorcall = kernel_call;
  return reinterpret_cast<PyObject*>(self);
}

PyTypeObject KernelType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyModuleDef module = {PyModuleDef_HEAD_INIT, "symfuse_call", nullptr, -1, nullptr};
}  // namespace

PyMODINIT_FUNC PyInit_symfuse_call() {
  KernelType.tp_name = "symfuse_call.Kernel";
  KernelType.tp_basicsize = sizeof(Kernel);
  KernelType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  KernelType.tp_new = kernel_new;
  KernelType.tp_call = PyVectorcall_Call;
  KernelType.tp_vectorcall_offset = offsetof(Kernel, vectorcall);
  if (PyType_Ready(&KernelType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module);
  if (m == nullptr) return nullptr;
  Py_INCREF(&KernelType);
  if (PyModule_AddObject(m, "Kernel", reinterpret_cast<PyObject*>(&KernelType)) < 0) return nullptr;
  return m;
}
""".replace("@ARITIES@", _ARITIES).replace("@MAX@", str(MAX_ARGS))


def python_include() -> str:
    """The folder of this Python's headers ("" when it has none)."""
    folder = sysconfig.get_paths().get("include", "")
    return folder if folder and os.path.exists(os.path.join(folder, "Python.h")) else ""


_PATHS: dict[object, str] = {}  # a loaded Kernel type -> the file it came from


def caller_path(kernel) -> str:
    """The file a `Kernel` type was loaded from ("" for None: calls through ctypes)."""
    return _PATHS.get(kernel, "") if kernel is not None else ""


def load_caller(path: str):
    """The `Kernel` type of the extension built at `path`."""
    loader = importlib.machinery.ExtensionFileLoader("symfuse_call", path)
    spec = importlib.util.spec_from_file_location("symfuse_call", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    _PATHS[module.Kernel] = path
    return module.Kernel
