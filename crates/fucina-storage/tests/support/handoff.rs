//! The data hand-off the loom models of both pool tiers run (`loom_refcount`
//! over the shared pool, `loom_local` over the local tier): included with
//! `#[path]` (it is no test target of its own).
#![allow(unreachable_pub)]

use fucina_storage::Buffer;
use loom::thread;

/// Acquires a buffer through `acquire` and writes it; a reader on another
/// thread checks the write and drops its handle while this thread drops its
/// own, so either may drop last; then a second buffer is acquired and written
/// (the first one's memory when it came back in time). The buffer's data is a
/// loom-tracked cell: the reader's access must happen before the next user's
/// write. Both buffers are dropped on return.
pub fn write_share_reacquire(acquire: impl Fn() -> Buffer<f32>) {
    let mut a = acquire();
    a.get_mut().unwrap()[0] = 1.0;
    let b = a.clone();
    let t = thread::spawn(move || {
        assert_eq!(b[0], 1.0);
        drop(b);
    });
    drop(a);
    let mut c = acquire();
    c.get_mut().unwrap()[0] = 2.0;
    t.join().unwrap();
    drop(c);
}
