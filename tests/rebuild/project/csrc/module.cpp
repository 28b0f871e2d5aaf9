#include <Python.h>

#include "ops.h"

static PyObject* scale(PyObject*, PyObject* args) {
  long value = 0;
  if (!PyArg_ParseTuple(args, "l", &value)) return nullptr;
  return PyLong_FromLong(demo_scale(value));
}

static PyMethodDef methods[] = {{"scale", scale, METH_VARARGS, "value times the build's factor"},
                                {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", nullptr, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
