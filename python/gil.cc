#include "python/gil.h"

#include <chrono>
#include <thread>

namespace pebble::python {
namespace {

// threading.main_thread()'s ident (0: not read yet).
unsigned long main_thread_ident = 0;  // NOLINT(runtime/int): CPython's thread ids

bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

}  // namespace

void InitGil() {
  PyObject* threading = PyImport_ImportModule("threading");
  PyObject* main = threading != nullptr
                       ? PyObject_CallMethod(threading, "main_thread", nullptr) : nullptr;
  PyObject* ident = main != nullptr ? PyObject_GetAttrString(main, "ident") : nullptr;
  if (ident != nullptr) main_thread_ident = PyLong_AsUnsignedLong(ident);
  Py_XDECREF(ident);
  Py_XDECREF(main);
  Py_XDECREF(threading);
  PyErr_Clear();  // (unread: no thread waits, as before these guards)
}

bool ExitingWithoutThisThread() {
  return main_thread_ident != 0 && InterpreterFinalizing() &&
         PyThread_get_thread_ident() != main_thread_ident;
}

bool ThisThreadHoldsGil() {
#if PY_VERSION_HEX >= 0x030D0000
  PyThreadState* holder = PyThreadState_GetUnchecked();
#else
  PyThreadState* holder = _PyThreadState_UncheckedGet();
#endif
  return holder != nullptr && holder == PyGILState_GetThisThreadState();
}

void WaitForExit() {
  while (true) std::this_thread::sleep_for(std::chrono::hours(1));
}

}  // namespace pebble::python
