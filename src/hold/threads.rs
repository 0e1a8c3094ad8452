//! Threads of a hold: how they end.

/// Never joined, never detached: a detached thread on musl unmaps its own stack as it
/// ends, and that unmap flushes the TLB of the CPU where conlock's main thread runs
/// (an interrupt to a vCPU). The exit frees the stack with everything else.
pub(super) fn keep_joinable<T>(thread: std::thread::JoinHandle<T>) {
    std::mem::forget(thread);
}
