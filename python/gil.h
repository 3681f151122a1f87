// The GIL around pebble's C++ work and its calls of Python policies, safe
// where the interpreter exits while a daemon thread plans.
//
// From the moment the interpreter finalizes, a thread that takes the GIL
// is ended by CPython (pthread_exit: a forced unwind through the C++ frames
// above it). pybind11's guards then touch Python without the GIL in their
// destructors, or are ended inside one, which aborts the process ("terminate
// called without an active exception"). These guards never take the GIL
// once the interpreter finalizes: the thread waits for the process to end
// instead, as CPython's own daemon threads do; and they release it only
// where this thread holds it.
#ifndef PEBBLE_PYTHON_GIL_H_
#define PEBBLE_PYTHON_GIL_H_

#include <Python.h>
#include <cxxabi.h>

namespace pebble::python {

// Reads which thread is the main one; once, at the module's import.
void InitGil();

// Whether the interpreter is finalizing and this thread is not the one that
// finalizes it (the main thread, which may still run Python: a finalizer):
// this thread may not take the GIL.
bool ExitingWithoutThisThread();

// Blocks this thread until the process ends: a daemon thread's end at exit.
[[noreturn]] void WaitForExit();

// Whether this thread holds the GIL: not in a forced unwind at exit, where
// CPython ended the thread while it waited for the GIL. (PyGILState_Check
// cannot tell there: it answers true while the interpreter finalizes.)
bool ThisThreadHoldsGil();

// The GIL released for this scope (pybind11's gil_scoped_release); at its
// end taken back, or, where the interpreter exits without this thread,
// WaitForExit.
class GilReleased {
 public:
  GilReleased() : thread_state_(PyEval_SaveThread()) {}
  ~GilReleased() {
    if (ExitingWithoutThisThread()) WaitForExit();
    try {  // (finalizing may begin while this thread waits for the GIL)
      PyEval_RestoreThread(thread_state_);
    } catch (const abi::__forced_unwind&) {
      WaitForExit();
    }
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* thread_state_;
};

// The GIL held for this scope, in any thread (pybind11's
// gil_scoped_acquire). Released at its end where this thread still holds
// it: not where a forced unwind at the interpreter's exit passes through.
class GilHeld {
 public:
  GilHeld() {
    if (ExitingWithoutThisThread()) WaitForExit();
    try {
      state_ = PyGILState_Ensure();
    } catch (const abi::__forced_unwind&) {
      WaitForExit();
    }
  }
  ~GilHeld() {
    if (ThisThreadHoldsGil()) PyGILState_Release(state_);
  }
  GilHeld(const GilHeld&) = delete;
  GilHeld& operator=(const GilHeld&) = delete;

 private:
  PyGILState_STATE state_;
};

}  // namespace pebble::python

#endif  // PEBBLE_PYTHON_GIL_H_
