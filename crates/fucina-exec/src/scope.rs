//! The exec-scope stack (reference §5.3): type-erased entries, two-phase adoption.
//!
//! The exec layer knows nothing about autograd: an entry is a [`RawTensor`] and/or
//! an opaque [`ScopeNode`] (the autograd layer stores its graph node there). While
//! a scope is open, the layer above adopts op results into it; closing the scope
//! releases every entry adopted since it opened, newest first.

use std::any::Any;
use std::sync::Arc;

use crate::context::ExecContext;
use crate::error::ExecError;
use crate::tensor::RawTensor;

/// A type-erased payload an exec scope keeps alive until it closes (the autograd
/// layer's graph node). Made from an `Arc` without allocating.
///
/// When the scope releases it, the payload's release hook runs with the `Arc`
/// (plain `drop` for [`ScopeNode::new`]; the layer's own function for
/// [`ScopeNode::with_release`], e.g. to return a node whose last handle this was
/// to a free list instead of deallocating it).
#[derive(Clone)]
pub struct ScopeNode {
    node: Option<Arc<dyn Any + Send + Sync>>,
    release: fn(Arc<dyn Any + Send + Sync>),
}

impl ScopeNode {
    /// Wraps a shared node (an unsizing coercion of the `Arc`: no allocation);
    /// releasing it drops the `Arc`.
    pub fn new<N: Any + Send + Sync>(node: Arc<N>) -> ScopeNode {
        ScopeNode::with_release(node, drop)
    }

    /// Wraps a shared node whose release calls `release` with the `Arc` (which
    /// may be the last handle; `Arc::downcast` recovers the node's type without
    /// allocating).
    pub fn with_release<N: Any + Send + Sync>(
        node: Arc<N>,
        release: fn(Arc<dyn Any + Send + Sync>),
    ) -> ScopeNode {
        ScopeNode {
            node: Some(node),
            release,
        }
    }

    /// The node, if it is an `N`.
    pub fn downcast_ref<N: Any>(&self) -> Option<&N> {
        self.node.as_ref()?.downcast_ref()
    }
}

impl Drop for ScopeNode {
    fn drop(&mut self) {
        if let Some(n) = self.node.take() {
            (self.release)(n);
        }
    }
}

impl std::fmt::Debug for ScopeNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScopeNode(..)")
    }
}

/// The mark of an open exec scope, returned by
/// [`ExecContext::open_exec_scope`] and consumed by
/// [`ExecContext::close_exec_scope`].
#[must_use = "an exec scope stays open (holding its values) until it is closed"]
#[derive(Debug)]
pub struct ExecScope {
    mark: usize,
    depth: usize,
}

impl ExecScope {
    /// The number of entries that existed when the scope opened.
    pub fn mark(&self) -> usize {
        self.mark
    }

    /// The nesting depth of this scope (1 for the outermost).
    pub fn depth(&self) -> usize {
        self.depth
    }
}

struct Entry {
    value: Option<RawTensor>,
    node: Option<ScopeNode>,
}

/// The context's stack of adopted entries and open-scope marks.
#[derive(Default)]
pub(crate) struct ScopeStack {
    entries: Vec<Entry>,
    marks: Vec<usize>,
}

impl ScopeStack {
    pub(crate) fn depth(&self) -> usize {
        self.marks.len()
    }

    /// Pops the innermost scope's entries into `out` order (newest first) and drops
    /// them one at a time.
    pub(crate) fn force_close_innermost(&mut self) {
        if let Some(mark) = self.marks.pop() {
            while self.entries.len() > mark {
                let e = self.entries.pop().expect("len > mark");
                // Value first, then node (reference §5.3).
                drop(e.value);
                drop(e.node);
            }
        }
    }
}

impl ExecContext {
    /// Opens an exec scope nested in any open one. Values adopted from now on
    /// belong to it until [`close_exec_scope`](ExecContext::close_exec_scope).
    pub fn open_exec_scope(&self) -> ExecScope {
        let mut s = self.scopes.borrow_mut();
        let mark = s.entries.len();
        s.marks.push(mark);
        ExecScope {
            mark,
            depth: s.marks.len(),
        }
    }

    /// Closes `scope`, releasing every value and node adopted since it opened,
    /// newest first (each value before its node).
    ///
    /// # Panics
    /// If `scope` is not the innermost open scope: scopes are strictly nested and
    /// must be closed in reverse order of opening.
    pub fn close_exec_scope(&self, scope: ExecScope) {
        {
            let s = self.scopes.borrow();
            assert!(
                s.marks.len() == scope.depth && s.marks.last() == Some(&scope.mark),
                "close_exec_scope: scope at depth {} is not the innermost open scope \
                 (depth {}); exec scopes must be closed in reverse order of opening",
                scope.depth,
                s.marks.len()
            );
        }
        // Release one entry at a time, outside the borrow, so a node's destructor
        // may use the context.
        loop {
            let e = {
                let mut s = self.scopes.borrow_mut();
                if s.entries.len() > scope.mark {
                    s.entries.pop()
                } else {
                    s.marks.pop();
                    None
                }
            };
            match e {
                Some(e) => {
                    drop(e.value);
                    drop(e.node);
                }
                None => break,
            }
        }
    }

    /// Whether an exec scope is open.
    pub fn exec_scope_active(&self) -> bool {
        self.scopes.borrow().depth() > 0
    }

    /// The number of values and nodes held by open scopes.
    pub fn exec_scope_len(&self) -> usize {
        self.scopes.borrow().entries.len()
    }

    /// Runs `f` inside a fresh exec scope and closes it afterwards (also when `f`
    /// panics). Values adopted inside are released when it returns.
    pub fn exec_scope<R>(&self, f: impl FnOnce(&ExecContext) -> R) -> R {
        struct Close<'a>(&'a ExecContext, Option<ExecScope>);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                if let Some(s) = self.1.take() {
                    self.0.close_exec_scope(s);
                }
            }
        }
        let guard = Close(self, Some(self.open_exec_scope()));
        f(guard.0)
    }

    /// The fallible first phase of adoption: makes room for one more entry, so the
    /// following `adopt_*_assume_capacity` call cannot fail.
    ///
    /// # Errors
    /// [`ExecError::OutOfMemory`] if the entry list cannot grow.
    pub fn reserve_scope_slot(&self) -> Result<(), ExecError> {
        self.scopes
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
        let mut s = self.scopes.borrow_mut();
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
