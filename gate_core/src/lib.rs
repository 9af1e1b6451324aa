//! gatewrap's gate core: policy, audit log, the gate (forward proxy) and the pre-exec launcher.
//! `py` holds the pyo3 bindings (`gatewrap._gate_core`); everything else is plain Rust.

pub mod approvals;
pub mod audit;
pub mod gate;
pub mod launcher;
pub mod policy;
mod py;
mod py_approvals;
pub mod ringbuf;
pub mod root_dir;
