//! Passes the target interpreter's cfgs (`Py_GIL_DISABLED` among them) to the bindings.

fn main() {
    pyo3_build_config::use_pyo3_cfgs();
}
