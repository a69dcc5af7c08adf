// symfuse's kernel caller (symfuse/runtime/call.py): Kernel(address, arity)(*ints).
// SF_MAX_ARGS, the most arguments a kernel called through it takes, is defined by call.py.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace {
struct Kernel {
  PyObject_HEAD void* fn;
  Py_ssize_t arity;
  vectorcallfunc vectorcall;
};

// fn as a function of sizeof...(I) int64_t parameters, called with a[0..n)
template <size_t... I>
void call_with(void* fn, const int64_t* a, std::index_sequence<I...>) {
  using F = void (*)(decltype(I, int64_t{})...);
  reinterpret_cast<F>(fn)(a[I]...);
}

template <size_t... N>
void invoke_of(void* fn, Py_ssize_t n, const int64_t* a, std::index_sequence<N...>) {
  ((n == static_cast<Py_ssize_t>(N) ? call_with(fn, a, std::make_index_sequence<N>{}) : void()), ...);
}

void invoke(void* fn, Py_ssize_t n, const int64_t* a) {
  invoke_of(fn, n, a, std::make_index_sequence<SF_MAX_ARGS + 1>{});
}

PyObject* kernel_call(PyObject* self_, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  Kernel* self = reinterpret_cast<Kernel*>(self_);
  const Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr || n != self->arity) {
    PyErr_Format(PyExc_TypeError, "a symfuse kernel of %zd arguments was called with %zd", self->arity, n);
    return nullptr;
  }
  int64_t a[SF_MAX_ARGS];
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (args[i] == Py_None) {
      a[i] = 0;
      continue;
    }
    a[i] = PyLong_AsLongLong(args[i]);
    if (a[i] == -1 && PyErr_Occurred()) return nullptr;
  }
  void* fn = self->fn;
  Py_BEGIN_ALLOW_THREADS invoke(fn, n, a);
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

PyObject* kernel_new(PyTypeObject* type, PyObject* args, PyObject*) {
  unsigned long long address;
  Py_ssize_t arity;
  if (!PyArg_ParseTuple(args, "Kn", &address, &arity)) return nullptr;
  if (arity < 0 || arity > SF_MAX_ARGS) {
    return PyErr_Format(PyExc_ValueError, "a kernel takes 0 to %d arguments", SF_MAX_ARGS);
  }
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
