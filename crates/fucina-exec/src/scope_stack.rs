//! The data of the exec-scope stack, a runtime service the context owns: the
//! adopted entries, the open-scope marks and the type-erased [`ScopeNode`]
//! payload. It knows nothing of the context; the scope operations on
//! [`ExecContext`](crate::ExecContext) live in `scope.rs`.

use std::any::Any;
use std::sync::Arc;

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

/// One adopted value and/or node.
pub(crate) struct Entry {
    pub(crate) value: Option<RawTensor>,
    pub(crate) node: Option<ScopeNode>,
}

/// One open scope: where its entries start, and the serial its token carries.
#[derive(Clone, Copy)]
pub(crate) struct Mark {
    pub(crate) start: usize,
    pub(crate) serial: u64,
}

/// The context's stack of adopted entries and open-scope marks.
#[derive(Default)]
pub(crate) struct ScopeStack {
    pub(crate) entries: Vec<Entry>,
    pub(crate) marks: Vec<Mark>,
    /// The serial of the next scope opened (never reused within a context).
    pub(crate) next_serial: u64,
}

impl ScopeStack {
    pub(crate) fn depth(&self) -> usize {
        self.marks.len()
    }

    /// The index in `marks` of the open scope with `serial`.
    pub(crate) fn position(&self, serial: u64) -> Option<usize> {
        // Scopes are few and a token is usually the innermost: search from the top.
        self.marks.iter().rposition(|m| m.serial == serial)
    }

    /// Pops the innermost scope's entries (newest first) and drops them one at a
    /// time.
    pub(crate) fn force_close_innermost(&mut self) {
        if let Some(mark) = self.marks.pop() {
            while self.entries.len() > mark.start {
                let e = self.entries.pop().expect("len > mark");
                // Each value before its node.
                drop(e.value);
                drop(e.node);
            }
        }
    }
}
