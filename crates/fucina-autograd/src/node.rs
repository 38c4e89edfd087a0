//! Graph nodes and the backward engine.
//!
//! A node is shared (`Arc`) by the tensor that owns it, by the nodes of the ops
//! that consumed that tensor, and by the exec scope that adopted it. An op's node
//! and its VJP closure live in one allocation (`Arc<OpNode<F>>`, used as
//! `Arc<dyn GraphNode>`); the input links of ops with up to three inputs are
//! stored inline. Nodes are numbered from one process-wide counter in creation
//! order; an op's inputs always exist before it, so sorting the reachable nodes by
//! decreasing number gives a valid reverse topological order without recursion.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fucina_exec::{Dims, ExecContext, RawTensor};

use crate::error::{AutogradError, Result};

/// The gradients a custom backward returns, one per input of the op (`None` where
/// the input needs none).
pub type Grads = Vec<Option<RawTensor>>;

/// A shared graph node.
pub(crate) type NodeRef = Arc<dyn GraphNode>;

const INLINE: usize = 3;

/// A short list stored inline up to three elements (the op arities), on the heap
/// beyond.
pub(crate) enum Small<T> {
    Inline([Option<T>; INLINE], usize),
    Heap(Vec<Option<T>>),
}

impl<T> Small<T> {
    pub(crate) fn as_slice(&self) -> &[Option<T>] {
        match self {
            Small::Inline(a, n) => &a[..*n],
            Small::Heap(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [Option<T>] {
        match self {
            Small::Inline(a, n) => &mut a[..*n],
            Small::Heap(v) => v,
        }
    }

    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn take(&mut self) -> Small<T> {
        std::mem::replace(self, Small::Inline([None, None, None], 0))
    }

    /// Takes the elements out one by one (the list is left empty).
    fn drain_into(&mut self, mut f: impl FnMut(T)) {
        match self {
            Small::Inline(a, n) => {
                for x in a[..*n].iter_mut().filter_map(Option::take) {
                    f(x);
                }
                *n = 0;
            }
            Small::Heap(v) => v.drain(..).flatten().for_each(f),
        }
    }
}

impl<T> From<Vec<Option<T>>> for Small<T> {
    fn from(v: Vec<Option<T>>) -> Self {
        if v.len() <= INLINE {
            let n = v.len();
            let mut a = [None, None, None];
            for (slot, x) in a.iter_mut().zip(v) {
                *slot = x;
            }
            Small::Inline(a, n)
        } else {
            Small::Heap(v)
        }
    }
}

impl<T> FromIterator<Option<T>> for Small<T> {
    fn from_iter<I: IntoIterator<Item = Option<T>>>(iter: I) -> Self {
        let mut a = [None, None, None];
        let mut n = 0;
        let mut it = iter.into_iter();
        for x in it.by_ref() {
            if n == INLINE {
                let mut v: Vec<Option<T>> = a.into_iter().collect();
                v.push(x);
                v.extend(it);
                return Small::Heap(v);
            }
            a[n] = x;
            n += 1;
        }
        Small::Inline(a, n)
    }
}

/// The gradients a built-in VJP returns (inline for up to three inputs).
pub(crate) type GradList = Small<RawTensor>;

/// Builds a [`GradList`] without allocating (up to three entries).
macro_rules! grads {
    ($($g:expr),* $(,)?) => {
        <$crate::node::GradList as FromIterator<_>>::from_iter([$($g),*])
    };
}
pub(crate) use grads;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

/// What every node has: its number, shape, input links and gradient state.
pub(crate) struct Header {
    /// Creation number (strictly increasing).
    id: u64,
    /// The shape of the tensor this node belongs to.
    dims: Dims,
    /// The op's inputs (`None` for an input that records no graph); empty for a
    /// leaf variable.
    links: Small<NodeRef>,
    leaf: bool,
    name: &'static str,
    /// The backward pass that last visited this node.
    visited: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The accumulated gradient of a leaf, or the pending gradient of an op
    /// output while backward runs.
    grad: Option<RawTensor>,
    /// Set when a backward without `retain_graph` released the VJP.
    consumed: bool,
}

impl Header {
    fn new(name: &'static str, dims: Dims, links: Small<NodeRef>, leaf: bool) -> Header {
        Header {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            dims,
            links,
            leaf,
            name,
            visited: AtomicU64::new(0),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A graph node: a leaf, or an op with its VJP.
pub(crate) trait GraphNode: Send + Sync + 'static {
    fn header(&self) -> &Header;
    fn header_mut(&mut self) -> &mut Header;
    /// Runs the VJP (`None` if it was released); releases it unless `retain`.
    fn run_vjp(
        &self,
        ctx: &ExecContext,
        g: &RawTensor,
        needs: &[bool],
        retain: bool,
    ) -> Option<Result<GradList>>;
}

struct LeafNode {
    header: Header,
}

impl GraphNode for LeafNode {
    fn header(&self) -> &Header {
        &self.header
    }
    fn header_mut(&mut self) -> &mut Header {
        &mut self.header
    }
    fn run_vjp(
        &self,
        _: &ExecContext,
        _: &RawTensor,
        _: &[bool],
        _: bool,
    ) -> Option<Result<GradList>> {
        None
    }
}

/// An op node; the VJP closure (and the tensors it saved) sits in the same
/// allocation.
pub(crate) struct OpNode<F> {
    header: Header,
    vjp: Mutex<Option<F>>,
}

impl<F> GraphNode for OpNode<F>
where
    F: Fn(&ExecContext, &RawTensor, &[bool]) -> Result<GradList> + Send + Sync + 'static,
{
    fn header(&self) -> &Header {
        &self.header
    }
    fn header_mut(&mut self) -> &mut Header {
        &mut self.header
    }
    fn run_vjp(
        &self,
        ctx: &ExecContext,
        g: &RawTensor,
        needs: &[bool],
        retain: bool,
    ) -> Option<Result<GradList>> {
        let mut slot = self.vjp.lock().unwrap_or_else(|e| e.into_inner());
        if retain {
            let f = slot.as_ref()?;
            Some(f(ctx, g, needs))
        } else {
            let f = slot.take()?;
            drop(slot);
            let r = f(ctx, g, needs);
            // Releases the tensors the op saved for backward.
            drop(f);
            Some(r)
        }
    }
}

/// A new leaf node.
pub(crate) fn leaf(dims: Dims) -> NodeRef {
    Arc::new(LeafNode {
        header: Header::new("leaf", dims, Small::Inline([None, None, None], 0), true),
    })
}

/// A new op node.
pub(crate) fn op<F>(name: &'static str, dims: Dims, links: Small<NodeRef>, vjp: F) -> Arc<OpNode<F>>
where
    F: Fn(&ExecContext, &RawTensor, &[bool]) -> Result<GradList> + Send + Sync + 'static,
{
    Arc::new(OpNode {
        header: Header::new(name, dims, links, false),
        vjp: Mutex::new(Some(vjp)),
    })
}

impl dyn GraphNode {
    pub(crate) fn is_leaf(&self) -> bool {
        self.header().leaf
    }

    pub(crate) fn id(&self) -> u64 {
        self.header().id
    }

    pub(crate) fn name(&self) -> &'static str {
        self.header().name
    }

    /// The accumulated gradient of a leaf (a shared handle, no copy).
    pub(crate) fn grad(&self) -> Option<RawTensor> {
        let h = self.header();
        if !h.leaf {
            return None;
        }
        h.lock().grad.clone()
    }

    pub(crate) fn zero_grad(&self) {
        let old = self.header().lock().grad.take();
        drop(old);
    }

    /// Adds `g` to the node's gradient (never overwrites).
    fn accumulate(&self, ctx: &ExecContext, g: RawTensor, op: &'static str) -> Result<()> {
        let h = self.header();
        if g.shape() != h.dims.as_slice() {
            return Err(AutogradError::GradientShapeMismatch {
                op,
                expected: h.dims,
                got: g.dims(),
            });
        }
        let mut st = h.lock();
        let new = match st.grad.take() {
            None => g,
            // In place when this node holds the only handle (otherwise, e.g. while a
            // grad view is alive, a fresh sum).
            Some(old) if old.is_contiguous() && old.is_unique() => ctx.take_add_no_grad(old, &g)?,
            Some(old) => match ctx.add(&old, &g) {
                Ok(s) => s,
                Err(e) => {
                    st.grad = Some(old);
                    return Err(e.into());
                }
            },
        };
        st.grad = Some(new);
        Ok(())
    }
}

thread_local! {
    /// Reused by every drop of a graph on this thread (no allocation once grown).
    static DROP_STACK: RefCell<Vec<Small<NodeRef>>> = const { RefCell::new(Vec::new()) };
    /// Reused by every backward on this thread.
    static SCRATCH: RefCell<Vec<NodeRef>> = const { RefCell::new(Vec::new()) };
}

impl Drop for Header {
    /// Releases a chain of nodes iteratively: a graph of any depth drops without
    /// recursion.
    fn drop(&mut self) {
        if self.links.len() == 0 {
            return;
        }
        let mut first = Some(self.links.take());
        let _ = DROP_STACK.try_with(|s| {
            if let Ok(mut stack) = s.try_borrow_mut() {
                release(&mut stack, first.take().expect("taken once"));
            }
        });
        // A node dropped while this thread's stack is in use (by a VJP closure that
        // held a tensor), or during thread teardown, gets a stack of its own.
        if let Some(first) = first {
            release(&mut Vec::new(), first);
        }
    }
}

/// Drops `first` and every node only it kept alive, depth-first over `stack`.
fn release(stack: &mut Vec<Small<NodeRef>>, first: Small<NodeRef>) {
    let base = stack.len();
    stack.push(first);
    while stack.len() > base {
        let mut list = stack.pop().expect("len > base");
        list.drain_into(|mut child| {
            if let Some(c) = Arc::get_mut(&mut child) {
                let grand = c.header_mut().links.take();
                if grand.len() > 0 {
                    stack.push(grand);
                }
            }
            // `child` drops here with no links (or stays alive, shared).
        });
    }
}

/// Options of [`Tensor::backward_with`](crate::Tensor::backward_with).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackwardOptions {
    /// Keep the graph (its VJPs and saved tensors) so that backward can run over it
    /// again. By default backward releases them as it goes, and a second backward
    /// over the same graph is [`AutogradError::BackwardAlreadyRun`].
    pub retain_graph: bool,
}

/// Runs backward from `root` seeded with `seed` (already checked to have the
/// root's shape).
pub(crate) fn run_backward(
    ctx: &ExecContext,
    root: &NodeRef,
    seed: RawTensor,
    opts: BackwardOptions,
) -> Result<()> {
    if !root.is_leaf() && root.header().lock().consumed {
        return Err(AutogradError::BackwardAlreadyRun);
    }
    let reused = SCRATCH.try_with(|s| {
        s.try_borrow_mut()
            .map(|mut order| backward_into(ctx, root, seed.clone(), opts, &mut order))
            .ok()
    });
    match reused {
        Ok(Some(r)) => r,
        // A backward from inside a VJP, or during thread teardown.
        _ => backward_into(ctx, root, seed, opts, &mut Vec::new()),
    }
}

fn backward_into(
    ctx: &ExecContext,
    root: &NodeRef,
    seed: RawTensor,
    opts: BackwardOptions,
    order: &mut Vec<NodeRef>,
) -> Result<()> {
    order.clear();
    // Collect the reachable nodes iteratively: `order` doubles as the work list
    // (every node is pushed once, when first seen).
    let epoch = NEXT_EPOCH.fetch_add(1, Ordering::Relaxed);
    root.header().visited.store(epoch, Ordering::Relaxed);
    order.push(Arc::clone(root));
    let mut next = 0;
    while next < order.len() {
        let n = Arc::clone(&order[next]);
        next += 1;
        for i in n.header().links.as_slice().iter().flatten() {
            if i.header().visited.swap(epoch, Ordering::Relaxed) != epoch {
                order.push(Arc::clone(i));
            }
        }
    }
    // Reverse creation order is a reverse topological order.
    order.sort_unstable_by_key(|n| std::cmp::Reverse(n.id()));

    let result = root
        .accumulate(ctx, seed, "backward")
        .and_then(|()| propagate(ctx, order, opts));
    if result.is_err() {
        // Drop the pending gradients of op nodes so that a failed backward leaves
        // no partial state behind (leaves keep what they accumulated).
        for n in order.iter().filter(|n| !n.is_leaf()) {
            n.header().lock().grad = None;
        }
    }
    order.clear();
    result
}

fn propagate(ctx: &ExecContext, order: &[NodeRef], opts: BackwardOptions) -> Result<()> {
    for n in order.iter().filter(|n| !n.is_leaf()) {
        let h = n.header();
        let g = {
            let mut st = h.lock();
            let Some(g) = st.grad.take() else { continue };
            if st.consumed {
                return Err(AutogradError::BackwardAlreadyRun);
            }
            if !opts.retain_graph {
                st.consumed = true;
            }
            g
        };
        let links = h.links.as_slice();
        let mut inline = [false; INLINE];
        let mut heap = Vec::new();
        let needs: &[bool] = if links.len() <= INLINE {
            for (k, l) in inline.iter_mut().zip(links) {
                *k = l.is_some();
            }
            &inline[..links.len()]
        } else {
            heap.extend(links.iter().map(Option::is_some));
            &heap
        };
        let mut grads = match n.run_vjp(ctx, &g, needs, opts.retain_graph) {
            None => return Err(AutogradError::BackwardAlreadyRun),
            Some(r) => r?,
        };
        drop(g);
        let grads = grads.as_mut_slice();
        if grads.len() != links.len() {
            return Err(AutogradError::GradientCountMismatch {
                op: h.name,
                expected: links.len(),
                got: grads.len(),
            });
        }
        for (input, gi) in links.iter().zip(grads) {
            if let (Some(input), Some(gi)) = (input, gi.take()) {
                input.accumulate(ctx, gi, h.name)?;
            }
        }
    }
    Ok(())
}
