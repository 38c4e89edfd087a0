//! The exec-scope stack: type-erased entries, two-phase adoption, tokens tied to
//! their context.
//!
//! The exec layer knows nothing about autograd: an entry is a [`RawTensor`] and/or
//! an opaque [`ScopeNode`] (the autograd layer stores its graph node there). While
//! a scope is open, the layer above adopts op results into it; closing the scope
//! releases every entry adopted since it opened, newest first.

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::tensor::RawTensor;

pub use crate::scope_stack::ScopeNode;
use crate::scope_stack::{Entry, Mark};

/// The mark of an open exec scope, returned by
/// [`ExecContext::open_exec_scope`] and consumed by
/// [`ExecContext::close_exec_scope`].
///
/// The token borrows the context that opened it, so it cannot outlive it, and it
/// is tied to that one scope: it records the context and a serial number unique
/// within it. Dropping a token that was not closed closes its scope (and every
/// scope opened inside it, innermost first) — so an early return with `?`, or a
/// panic, between `open_exec_scope` and `close_exec_scope` never leaves a scope
/// open. Dropping never panics.
#[must_use = "an exec scope stays open (holding its values) until it is closed or dropped"]
pub struct ExecScope<'ctx> {
    ctx: &'ctx ExecContext,
    serial: u64,
    mark: usize,
    depth: usize,
}

impl ExecScope<'_> {
    /// The number of entries that existed when the scope opened.
    pub fn mark(&self) -> usize {
        self.mark
    }

    /// The nesting depth of this scope when it opened (1 for the outermost).
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Whether the scope is still open (an enclosing scope's close, or the
    /// context's teardown, may have closed it already).
    pub fn is_open(&self) -> bool {
        self.ctx.scopes().borrow().position(self.serial).is_some()
    }
}

impl std::fmt::Debug for ExecScope<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecScope")
            .field("mark", &self.mark)
            .field("depth", &self.depth)
            .field("serial", &self.serial)
            .finish()
    }
}

impl Drop for ExecScope<'_> {
    fn drop(&mut self) {
        // Never panics (this runs during unwinding too): a scope already closed
        // is left alone.
        self.ctx.close_scope_serial(self.serial);
    }
}

impl ExecContext {
    /// Opens an exec scope nested in any open one. Values adopted from now on
    /// belong to it until it is closed ([`close_exec_scope`](ExecContext::close_exec_scope),
    /// the token's drop, the close of an enclosing scope, or the context's teardown).
    pub fn open_exec_scope(&self) -> ExecScope<'_> {
        let mut s = self.scopes().borrow_mut();
        let start = s.entries.len();
        let serial = s.next_serial;
        s.next_serial += 1;
        s.marks.push(Mark { start, serial });
        ExecScope {
            ctx: self,
            serial,
            mark: start,
            depth: s.marks.len(),
        }
    }

    /// Closes `scope`, releasing every value and node adopted since it opened,
    /// newest first (each value before its node).
    ///
    /// Scopes nest: if scopes opened inside `scope` are still open, they are
    /// closed first, innermost first (their tokens become inert). A token whose
    /// scope an enclosing close already ended closes nothing.
    ///
    /// # Panics
    /// If `scope` was opened on another context (the contract: a scope is closed
    /// on the context that opened it). Nothing of this context changes, and the
    /// token, dropped while the panic unwinds, closes its scope on its own context.
    pub fn close_exec_scope(&self, scope: ExecScope<'_>) {
        assert!(
            std::ptr::eq(scope.ctx, self),
            "close_exec_scope: the scope was opened on another ExecContext; \
             a scope must be closed on the context that opened it"
        );
        // The token's drop does the closing.
        drop(scope);
    }

    /// Closes the open scope with `serial` and every scope opened inside it,
    /// innermost first; does nothing if it is not open. Never panics (entries are
    /// released outside the borrow, so a node's destructor may use the context).
    fn close_scope_serial(&self, serial: u64) {
        let Ok(s) = self.scopes().try_borrow() else {
            // Only reachable from a destructor run inside a borrow of the stack,
            // which this module never lets happen; the teardown closes it then.
            return;
        };
        let Some(pos) = s.position(serial) else {
            return;
        };
        drop(s);
        loop {
            let e = {
                let Ok(mut s) = self.scopes().try_borrow_mut() else {
                    return;
                };
                if s.marks.len() <= pos {
                    // Closed (a destructor may have closed it already).
                    return;
                }
                let start = s.marks.last().expect("len > pos").start;
                if s.entries.len() > start {
                    s.entries.pop()
                } else {
                    s.marks.pop();
                    None
                }
            };
            if let Some(e) = e {
                drop(e.value);
                drop(e.node);
            }
        }
    }

    /// Whether an exec scope is open.
    pub fn exec_scope_active(&self) -> bool {
        self.scopes().borrow().depth() > 0
    }

    /// The number of values and nodes held by open scopes.
    pub fn exec_scope_len(&self) -> usize {
        self.scopes().borrow().entries.len()
    }

    /// Runs `f` inside a fresh exec scope and closes it afterwards, also when `f`
    /// returns early or panics. Values adopted inside are released when it
    /// returns; scopes `f` opened and left open (a token dropped late, or
    /// forgotten) are closed with it, innermost first. Closing never panics, so
    /// a panic in `f` unwinds through here normally.
    pub fn exec_scope<R>(&self, f: impl FnOnce(&ExecContext) -> R) -> R {
        let _scope = self.open_exec_scope();
        f(self)
    }

    /// The fallible first phase of adoption: makes room for one more entry, so the
    /// following `adopt_*_assume_capacity` call cannot fail.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the entry list cannot grow.
    pub fn reserve_scope_slot(&self) -> Result<(), ExecError> {
        self.scopes()
            .borrow_mut()
            .entries
            .try_reserve(1)
            .map_err(|_| ExecError::OutOfMemory {
                op: "reserve_scope_slot",
                source: fucina_storage::StorageError::AllocationFailed {
                    bytes: std::mem::size_of::<Entry>(),
                },
            })
    }

    /// Adopts `value` (and an optional node) into the innermost open scope, which
    /// keeps them alive until it closes. Never allocates.
    ///
    /// # Panics
    /// If no scope is open, or if no slot was reserved with
    /// [`reserve_scope_slot`](ExecContext::reserve_scope_slot).
    pub fn adopt_scope_value_assume_capacity(&self, value: RawTensor, node: Option<ScopeNode>) {
        self.adopt(Entry {
            value: Some(value),
            node,
        });
    }

    /// Adopts a node alone into the innermost open scope. Never allocates.
    ///
    /// # Panics
    /// As [`adopt_scope_value_assume_capacity`](ExecContext::adopt_scope_value_assume_capacity).
    pub fn adopt_scope_node_assume_capacity(&self, node: ScopeNode) {
        self.adopt(Entry {
            value: None,
            node: Some(node),
        });
    }

    fn adopt(&self, e: Entry) {
        let mut s = self.scopes().borrow_mut();
        assert!(
            s.depth() > 0,
            "adopt_scope_*_assume_capacity: no exec scope is open"
        );
        assert!(
            s.entries.len() < s.entries.capacity(),
            "adopt_scope_*_assume_capacity: no reserved slot (call reserve_scope_slot first)"
        );
        s.entries.push(e);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use std::any::Any;
    use std::sync::Arc;

    use super::*;

    static RELEASED: AtomicUsize = AtomicUsize::new(0);

    fn count_release(n: Arc<dyn Any + Send + Sync>) {
        assert!(n.downcast_ref::<u32>().is_some());
        RELEASED.fetch_add(1, Ordering::Relaxed);
    }

    #[test]
    fn a_scope_node_runs_its_release_hook_at_close() {
        let ctx = ExecContext::with_threads(1);
        let scope = ctx.open_exec_scope();
        ctx.reserve_scope_slot().unwrap();
        let node = ScopeNode::with_release(Arc::new(7u32), count_release);
        assert_eq!(node.downcast_ref::<u32>(), Some(&7));
        ctx.adopt_scope_node_assume_capacity(node);
        assert_eq!(RELEASED.load(Ordering::Relaxed), 0);
        ctx.close_exec_scope(scope);
        assert_eq!(RELEASED.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_extension_slot_is_created_once_and_dropped_with_the_context() {
        let ctx = ExecContext::with_threads(1);
        let a = Arc::new(5u64);
        assert_eq!(**ctx.extension(|| Arc::clone(&a)), 5);
        assert_eq!(**ctx.extension(|| Arc::new(6u64)), 5, "init runs once");
        assert_eq!(Arc::strong_count(&a), 2);
        drop(ctx);
        assert_eq!(Arc::strong_count(&a), 1);
    }
}
