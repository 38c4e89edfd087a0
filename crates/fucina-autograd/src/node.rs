//! Graph nodes, their per-context free list, and the backward engine.
//!
//! A node is shared (`Arc<Node>`) by the tensor that owns it, by the nodes of the
//! ops that consumed that tensor, and by the exec scope that adopted it. Every op
//! node has the same type: its VJP is a plain function pointer plus the op's
//! [`Saved`](crate::record::Saved) variant (the tensors, shapes and scalars
//! the op keeps for backward, by name; the schema is `record.rs`), stored
//! inline, as are the input links of ops with up to three inputs. So a node
//! is one fixed-size allocation, and a released node is not deallocated: it goes
//! back, emptied, to the free list of the context that made it ([`NodePool`], kept
//! in the context's extension slot), and the next op on that context reuses it.
//! A custom op's VJP closure lives in a boxed slot that goes back, emptied, to
//! the same pool (one free list per closure type) and is refilled by the next
//! op with a closure of that type; leaves return to a free list of the thread
//! that made them; each backward pass takes its work lists from a per-thread
//! stack (a backward inside a VJP takes the next). After a warm-up step,
//! recording a graph and running its backward allocate nothing.
//!
//! Nodes are numbered from one process-wide counter in creation order; an op's
//! inputs always exist before it, so sorting the reachable nodes by decreasing
//! number gives a valid reverse topological order without recursion.

use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fucina_exec::{Dims, ExecContext, RawTensor, ScopeNode};

use crate::error::{AutogradError, Result};
use crate::record::{BoxedVjp, GradList, Vjp};

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
                // One allocation for the whole list when the iterator knows
                // its length.
                let mut v = Vec::with_capacity(INLINE + 1 + it.size_hint().0);
                v.extend(a);
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

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static NEXT_EPOCH: AtomicU64 = AtomicU64::new(1);

/// A graph node: a leaf variable or an op with its VJP.
pub(crate) struct Node {
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
    vjp: Mutex<Vjp>,
    /// The free list this node returns to when its last handle drops (its
    /// context's for an op node, its thread's for a leaf; `None` while the
    /// node sits in a free list).
    home: Option<Arc<NodePool>>,
}

#[derive(Default)]
struct State {
    /// The accumulated gradient of a leaf (op nodes hold none: a backward pass
    /// keeps their pending gradients in its own scratch lists).
    grad: Option<RawTensor>,
    /// Set when a backward without `retain_graph` ran the VJP (it releases the
    /// VJP once the whole pass has succeeded, and clears the flag if it fails).
    consumed: bool,
}

/// The most released nodes a context keeps for reuse (a node is under 1 KiB,
/// see the `node_size` test: at most about 12 MiB); beyond this, released nodes are deallocated, so a
/// graph of a million ops does not pin a million nodes' memory for good, and a
/// step that records more ops than this allocates the excess.
pub(crate) const MAX_FREE_NODES: usize = 1 << 14;

/// The most emptied closure slots of one type a context keeps for reuse
/// (beyond this, released slots are deallocated).
const MAX_FREE_SLOTS: usize = 1 << 12;

/// A context's free list of emptied nodes, and of emptied VJP closure slots by
/// closure type (kept in the context's extension slot; nodes that outlive
/// their context keep it alive and return to it, and it is freed with the last
/// of them).
#[derive(Default)]
pub(crate) struct NodePool {
    free: Mutex<Vec<Arc<Node>>>,
    /// Emptied boxed closure slots (see [`BoxedVjp`]), one list per slot type.
    slots: Mutex<Vec<(TypeId, Vec<BoxedVjp>)>>,
}

impl NodePool {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<Node>>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_slots(&self) -> MutexGuard<'_, Vec<(TypeId, Vec<BoxedVjp>)>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pool of `ctx` (created on first use).
    pub(crate) fn of(ctx: &ExecContext) -> &Arc<NodePool> {
        ctx.extension(|| Arc::new(NodePool::default()))
    }

    /// Released nodes waiting for reuse.
    pub(crate) fn free_len(&self) -> usize {
        self.lock().len()
    }

    fn put(&self, n: Arc<Node>) {
        let mut free = self.lock();
        if free.len() < MAX_FREE_NODES {
            free.push(n);
        } else {
            drop(free);
            drop(n);
        }
    }

    fn take(&self) -> Option<Arc<Node>> {
        self.lock().pop()
    }

    /// An emptied closure slot of type `ty`, if one is waiting.
    pub(crate) fn take_slot(&self, ty: TypeId) -> Option<BoxedVjp> {
        let mut slots = self.lock_slots();
        slots.iter_mut().find(|(t, _)| *t == ty)?.1.pop()
    }

    /// Releases a VJP: a closure slot is emptied (its captures dropped, outside
    /// the lock: they may hold graph nodes that come back here) and kept for
    /// reuse; anything else is dropped.
    fn put_vjp(&self, vjp: Vjp) {
        let Vjp::Boxed(mut slot) = vjp else {
            return;
        };
        slot.clear();
        let ty = slot.slot_type();
        let mut slots = self.lock_slots();
        let list = match slots.iter().position(|(t, _)| *t == ty) {
            Some(i) => &mut slots[i].1,
            None => {
                slots.push((ty, Vec::new()));
                &mut slots.last_mut().expect("just pushed").1
            }
        };
        if list.len() < MAX_FREE_SLOTS {
            list.push(slot);
        } else {
            drop(slots);
            drop(slot);
        }
    }
}

impl Node {
    fn new(name: &'static str, dims: Dims, links: Small<NodeRef>, leaf: bool, vjp: Vjp) -> Node {
        Node {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            dims,
            links,
            leaf,
            name,
            visited: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            vjp: Mutex::new(vjp),
            home: None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_leaf(&self) -> bool {
        self.leaf
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

    /// The accumulated gradient of a leaf (a shared handle, no copy).
    pub(crate) fn grad(&self) -> Option<RawTensor> {
        if !self.leaf {
            return None;
        }
        self.lock().grad.clone()
    }

    /// Gives a leaf's gradient storage of its own (contiguous, no other handle),
    /// copying it if needed; the values do not change.
    pub(crate) fn own_grad(&self, ctx: &ExecContext) -> Result<()> {
        let mut st = self.lock();
        if let Some(g) = &st.grad
            && !(g.is_contiguous() && g.is_unique())
        {
            let own = ctx.clone(g)?;
            st.grad = Some(own);
        }
        Ok(())
    }

    /// Multiplies a leaf's gradient by `s`, in place when its storage is its
    /// own. Returns whether there was a gradient.
    pub(crate) fn scale_grad(&self, ctx: &ExecContext, s: f32) -> Result<bool> {
        let mut st = self.lock();
        let Some(g) = st.grad.take() else {
            return Ok(false);
        };
        if g.is_contiguous() && g.is_unique() {
            st.grad = Some(ctx.take_scale_no_grad(g, s)?);
        } else {
            match ctx.scale(&g, s) {
                Ok(scaled) => st.grad = Some(scaled),
                Err(e) => {
                    st.grad = Some(g);
                    return Err(e.into());
                }
            }
        }
        Ok(true)
    }

    pub(crate) fn zero_grad(&self) {
        self.set_grad(None);
    }

    /// Replaces a leaf's gradient with `g` (the old one is dropped outside the
    /// lock).
    pub(crate) fn set_grad(&self, g: Option<RawTensor>) {
        let old = std::mem::replace(&mut self.lock().grad, g);
        drop(old);
    }

    /// Releases the VJP (and what it saved): a closure slot goes back,
    /// emptied, to the node's free list.
    fn release_vjp(&self) {
        let vjp = std::mem::replace(
            &mut *self.vjp.lock().unwrap_or_else(|e| e.into_inner()),
            Vjp::None,
        );
        match &self.home {
            Some(home) => home.put_vjp(vjp),
            None => drop(vjp),
        }
    }

    /// Runs the VJP (`None` if it was released). The VJP is kept: a pass
    /// releases the VJPs it ran only once it has succeeded.
    fn run_vjp(
        &self,
        ctx: &ExecContext,
        g: &RawTensor,
        needs: &[bool],
    ) -> Option<Result<GradList>> {
        let slot = self.vjp.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Vjp::None => None,
            Vjp::Fn(f, s) => Some(f(ctx, s, g, needs)),
            Vjp::Boxed(f) => f.call(ctx, g, needs),
        }
    }

    /// Commits the gradient `g` that one backward pass summed for this leaf:
    /// adds it to the accumulated gradient (never overwrites). `g` has the
    /// leaf's shape, and when the leaf already holds a gradient that is not
    /// unique and contiguous, `g` itself is unique and contiguous (the caller,
    /// [`backward_into`], copied it beforehand), so both paths add in place and
    /// allocate nothing.
    fn commit(&self, ctx: &ExecContext, g: RawTensor) -> Result<()> {
        let mut st = self.lock();
        let new = match st.grad.take() {
            None => g,
            // In place in the old gradient when this node holds its only handle,
            // else (a grad view is alive) in place in `g`, so that the view never
            // changes; the sum is `old + g` either way (addition commutes).
            Some(old) if old.is_contiguous() && old.is_unique() => ctx.take_add_no_grad(old, &g)?,
            Some(old) => match ctx.take_add_no_grad(g, &old) {
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

    /// Whether [`commit`](Node::commit)ting `g` could need fresh storage: the
    /// leaf holds a gradient that is shared or strided, and `g` is shared or
    /// strided too.
    fn commit_needs_copy(&self, g: &RawTensor) -> bool {
        let st = self.lock();
        match &st.grad {
            None => false,
            Some(old) => {
                let own = |t: &RawTensor| t.is_contiguous() && t.is_unique();
                !own(old) && !own(g)
            }
        }
    }
}

/// A handle on a graph node. Dropping the last handle returns the node, emptied,
/// to its context's free list (see the module docs).
pub(crate) struct NodeRef(Option<Arc<Node>>);

impl Clone for NodeRef {
    fn clone(&self) -> Self {
        NodeRef(self.0.clone())
    }
}

impl Deref for NodeRef {
    type Target = Node;
    fn deref(&self) -> &Node {
        self.0.as_deref().expect("a live node handle")
    }
}

impl Drop for NodeRef {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            release_node(n);
        }
    }
}

impl NodeRef {
    /// The node as an exec-scope payload whose release recycles it too.
    pub(crate) fn scope_node(&self) -> ScopeNode {
        let arc = Arc::clone(self.0.as_ref().expect("a live node handle"));
        ScopeNode::with_release(arc, release_scope_node)
    }
}

/// The release hook of a node adopted by an exec scope.
fn release_scope_node(n: Arc<dyn Any + Send + Sync>) {
    if let Ok(n) = n.downcast::<Node>() {
        release_node(n);
    }
}

/// Drops one handle on `n`; when it is the last one, empties the node and
/// returns it to its free list. (Two threads dropping the last two handles at the
/// same instant may both see a shared node: the node is then deallocated
/// normally, a missed reuse, never a double use.)
fn release_node(mut n: Arc<Node>) {
    let Some(node) = Arc::get_mut(&mut n) else {
        return; // shared: only the count drops
    };
    let Some(home) = node.home.take() else {
        return; // a node made without a pool: deallocated normally
    };
    let links = node.links.take();
    let vjp = std::mem::replace(
        node.vjp.get_mut().unwrap_or_else(|e| e.into_inner()),
        Vjp::None,
    );
    let grad = node
        .state
        .get_mut()
        .unwrap_or_else(|e| e.into_inner())
        .grad
        .take();
    home.put_vjp(vjp);
    drop(grad);
    release_links(links);
    home.put(n);
}

/// The number of released graph nodes waiting for reuse in `ctx`'s free list.
///
/// Every op that records a graph node takes one from this list when it is not
/// empty; a node returns to it, emptied (its saved tensors released), when its
/// last handle drops, be it a tensor, a consuming op's node or the exec scope
/// that adopted it. After a warm-up training step the list holds the step's
/// nodes, and the next step allocates none.
///
/// ```
/// use fucina_autograd::{Tensor, free_graph_nodes};
/// use fucina_autograd::exec::ExecContext;
///
/// let ctx = ExecContext::new();
/// let w = Tensor::variable_from_slice(&ctx, &[2], &[1., 2.])?;
/// let loss = w.mul(&ctx, &w)?.sum_all(&ctx)?; // two op nodes
/// assert_eq!(free_graph_nodes(&ctx), 0);
/// drop(loss); // releases both
/// assert_eq!(free_graph_nodes(&ctx), 2);
/// let again = w.mul(&ctx, &w)?; // reuses one
/// assert_eq!(free_graph_nodes(&ctx), 1);
/// # drop(again);
/// # Ok::<(), fucina_autograd::AutogradError>(())
/// ```
pub fn free_graph_nodes(ctx: &ExecContext) -> usize {
    NodePool::of(ctx).free_len()
}

thread_local! {
    /// The free list of this thread's leaf nodes: a leaf made on this thread
    /// (a parameter, or a variable of an inner graph a VJP builds at every
    /// step, such as a recomputed block's) reuses a released one.
    static LEAVES: Arc<NodePool> = Arc::new(NodePool::default());
}

/// A new leaf node, reusing a released leaf of this thread's free list when
/// there is one.
pub(crate) fn leaf(dims: Dims) -> NodeRef {
    let node = Node::new(
        "leaf",
        dims,
        Small::Inline([None, None, None], 0),
        true,
        Vjp::None,
    );
    match LEAVES.try_with(Arc::clone) {
        Ok(pool) => recycled(&pool, node),
        // During thread teardown: a plain allocation.
        Err(_) => NodeRef(Some(Arc::new(node))),
    }
}

/// A new op node, reusing a released node of `ctx`'s free list when there is one.
pub(crate) fn op(
    ctx: &ExecContext,
    name: &'static str,
    dims: Dims,
    links: Small<NodeRef>,
    vjp: Vjp,
) -> NodeRef {
    recycled(NodePool::of(ctx), Node::new(name, dims, links, false, vjp))
}

/// `node` in a released node of `pool` when there is one (else a new
/// allocation), with `pool` as its home.
fn recycled(pool: &Arc<NodePool>, mut node: Node) -> NodeRef {
    node.home = Some(Arc::clone(pool));
    match pool.take() {
        Some(mut free) => {
            // Overwrites an emptied node (links, VJP and gradient were released
            // when it was put back).
            *Arc::get_mut(&mut free).expect("a free node has no other handle") = node;
            NodeRef(Some(free))
        }
        None => NodeRef(Some(Arc::new(node))),
    }
}

thread_local! {
    /// Reused by every drop of a graph on this thread (no allocation once grown).
    static DROP_STACK: RefCell<Vec<Small<NodeRef>>> = const { RefCell::new(Vec::new()) };
    /// The work lists of the backward passes on this thread, reused: a pass
    /// takes one (the last) and puts it back when it ends, so a backward
    /// inside a VJP (a recomputed block's, a checkpointed layer's) takes
    /// another and, after a warm-up step, neither allocates.
    static SCRATCH: RefCell<Vec<Scratch>> = const { RefCell::new(Vec::new()) };
}

/// The work lists of one backward pass: the reachable nodes in reverse
/// creation order, beside each the gradient it has received so far, and the
/// flags of which inputs need a gradient (for ops of more than three inputs).
#[derive(Default)]
struct Scratch {
    order: Vec<NodeRef>,
    slots: Vec<Slot>,
    needs: Vec<bool>,
}

/// What one backward pass holds for one reachable node. Gradients live here,
/// not in the nodes, until the pass commits: a pass that fails leaves no node
/// changed, and two passes over graphs that share nodes do not mix.
enum Slot {
    /// No gradient reached the node.
    Empty,
    /// The sum of the gradients that reached the node so far.
    Pending(RawTensor),
    /// An op node whose VJP ran in this pass.
    Ran,
}

impl Slot {
    /// Adds `g` to the pending gradient.
    fn add(&mut self, ctx: &ExecContext, g: RawTensor) -> Result<()> {
        let sum = match std::mem::replace(self, Slot::Empty) {
            // In place in whichever of the two the pass holds the only handle
            // of (the sum is `old + g` either way: addition commutes), as
            // `Node::commit` does; `take_add_no_grad` makes a fresh sum when
            // both are shared.
            Slot::Pending(old) if old.is_contiguous() && old.is_unique() => {
                ctx.take_add_no_grad(old, &g)?
            }
            Slot::Pending(old) => ctx.take_add_no_grad(g, &old)?,
            Slot::Empty | Slot::Ran => g,
        };
        *self = Slot::Pending(sum);
        Ok(())
    }
}

impl Drop for Node {
    /// Releases a chain of nodes iteratively: a graph of any depth drops without
    /// recursion.
    fn drop(&mut self) {
        release_links(self.links.take());
    }
}

/// Releases `first` and every node only it kept alive, iteratively.
fn release_links(first: Small<NodeRef>) {
    if first.len() == 0 {
        return;
    }
    let mut first = Some(first);
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

/// Drops `first` and every node only it kept alive, depth-first over `stack`.
/// Each unshared child's own links are taken out before the child is dropped (or
/// recycled), so no drop recurses more than one level.
fn release(stack: &mut Vec<Small<NodeRef>>, first: Small<NodeRef>) {
    let base = stack.len();
    stack.push(first);
    while stack.len() > base {
        let mut list = stack.pop().expect("len > base");
        list.drain_into(|mut child| {
            if let Some(c) = child.0.as_mut().and_then(Arc::get_mut) {
                let grand = c.links.take();
                if grand.len() > 0 {
                    stack.push(grand);
                }
            }
            // `child` drops (or is recycled) here with no links, or stays alive,
            // shared.
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
    /// Without `retain_graph`: release each op's VJP (and the tensors it
    /// saved) as soon as it has run, rather than once the whole pass has
    /// succeeded. The pass's peak memory is then the part of the graph still
    /// to run plus the gradients in flight, not the whole graph plus them
    /// (what a training step's backward holds drops layer by layer). The
    /// gradients are the same values. On an error no leaf's gradient has
    /// changed, as always, but the ops that ran have released what they
    /// saved: the graph cannot run again (a second backward over it is
    /// [`AutogradError::BackwardAlreadyRun`]). Ignored with `retain_graph`.
    pub release_as_it_goes: bool,
}

/// Runs backward from `root` seeded with `seed` (already checked to have the
/// root's shape).
///
/// All or nothing: the pass sums every gradient in its own scratch lists and
/// changes the graph only once every VJP has succeeded. It then adds each
/// leaf's sum to the leaf's gradient (the only step that could need memory is
/// done first, for every leaf, before any leaf changes) and, without
/// `retain_graph`, releases the VJPs that ran (with `release_as_it_goes`,
/// each as soon as it has run). On an error no leaf's gradient has changed
/// and (without `release_as_it_goes`) the graph is as it was: the same
/// backward can run again.
pub(crate) fn run_backward(
    ctx: &ExecContext,
    root: &NodeRef,
    seed: RawTensor,
    opts: BackwardOptions,
) -> Result<()> {
    if !root.is_leaf() && root.lock().consumed {
        return Err(AutogradError::BackwardAlreadyRun);
    }
    let mut scratch = SCRATCH
        .try_with(|s| s.try_borrow_mut().ok()?.pop())
        .ok()
        .flatten()
        .unwrap_or_default();
    let result = backward_into(ctx, root, seed, opts, &mut scratch);
    // Back for the next pass (during thread teardown it is dropped instead).
    let _ = SCRATCH.try_with(|s| {
        if let Ok(mut stack) = s.try_borrow_mut() {
            stack.push(scratch);
        }
    });
    result
}

fn backward_into(
    ctx: &ExecContext,
    root: &NodeRef,
    seed: RawTensor,
    opts: BackwardOptions,
    scratch: &mut Scratch,
) -> Result<()> {
    let Scratch {
        order,
        slots,
        needs,
    } = scratch;
    order.clear();
    slots.clear();
    // Collect the reachable nodes iteratively: `order` doubles as the work list
    // (every node is pushed once, when first seen).
    let epoch = NEXT_EPOCH.fetch_add(1, Ordering::Relaxed);
    root.visited.store(epoch, Ordering::Relaxed);
    order.push(root.clone());
    let mut next = 0;
    while next < order.len() {
        let n = order[next].clone();
        next += 1;
        for i in n.links.as_slice().iter().flatten() {
            if i.visited.swap(epoch, Ordering::Relaxed) != epoch {
                order.push(i.clone());
            }
        }
    }
    // Reverse creation order is a reverse topological order; the root, newer
    // than everything it depends on, comes first.
    order.sort_unstable_by_key(|n| std::cmp::Reverse(n.id()));
    slots.resize_with(order.len(), || Slot::Empty);
    slots[0] = Slot::Pending(seed);

    let result = propagate(ctx, order, slots, needs, opts).and_then(|()| commit(ctx, order, slots));
    match &result {
        Ok(()) => {
            // Release what ran (the VJPs and the tensors they saved), unless
            // the graph is retained.
            if !opts.retain_graph {
                for (n, s) in order.iter().zip(slots.iter()) {
                    if matches!(s, Slot::Ran) {
                        n.release_vjp();
                    }
                }
            }
        }
        Err(_) => {
            // Undo the claims: the nodes that ran are runnable again (unless
            // they released their VJPs as they went).
            if !opts.retain_graph && !opts.release_as_it_goes {
                for (n, s) in order.iter().zip(slots.iter()) {
                    if matches!(s, Slot::Ran) {
                        n.lock().consumed = false;
                    }
                }
            }
        }
    }
    // Drops the pending gradients (of a failed pass) and the node handles.
    slots.clear();
    order.clear();
    result
}

/// The position of `n` in `order` (sorted by decreasing creation number).
fn position(order: &[NodeRef], n: &Node) -> usize {
    order
        .binary_search_by(|p| n.id().cmp(&p.id()))
        .expect("every input of a reachable node is reachable")
}

/// Runs the VJP of every op node that received a gradient, in `order`, summing
/// the gradients of its inputs into their slots. Changes no node but the
/// `consumed` flags of the nodes it ran (without `retain_graph`), which
/// [`backward_into`] resets on an error.
fn propagate(
    ctx: &ExecContext,
    order: &[NodeRef],
    slots: &mut [Slot],
    heap: &mut Vec<bool>,
    opts: BackwardOptions,
) -> Result<()> {
    for (k, n) in order.iter().enumerate() {
        if n.is_leaf() {
            continue;
        }
        let g = match std::mem::replace(&mut slots[k], Slot::Empty) {
            Slot::Pending(g) => g,
            other => {
                slots[k] = other;
                continue;
            }
        };
        {
            let mut st = n.lock();
            if st.consumed {
                return Err(AutogradError::BackwardAlreadyRun);
            }
            if !opts.retain_graph {
                // Claimed: a concurrent pass over this node is refused.
                st.consumed = true;
            }
        }
        slots[k] = Slot::Ran;
        let h: &Node = n;
        let links = h.links.as_slice();
        let mut inline = [false; INLINE];
        let needs: &[bool] = if links.len() <= INLINE {
            for (k, l) in inline.iter_mut().zip(links) {
                *k = l.is_some();
            }
            &inline[..links.len()]
        } else {
            heap.clear();
            heap.extend(links.iter().map(Option::is_some));
            heap
        };
        let mut grads = match n.run_vjp(ctx, &g, needs) {
            None => return Err(AutogradError::BackwardAlreadyRun),
            Some(r) => r?,
        };
        drop(g);
        if opts.release_as_it_goes && !opts.retain_graph {
            n.release_vjp();
        }
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
                if gi.shape() != input.dims.as_slice() {
                    return Err(AutogradError::GradientShapeMismatch {
                        op: h.name,
                        expected: Box::new(input.dims),
                        got: Box::new(gi.dims()),
                    });
                }
                slots[position(order, input)].add(ctx, gi)?;
            }
        }
    }
    Ok(())
}

/// Adds every leaf's pending gradient to the leaf. First, the one step that can
/// fail: a pending gradient that could not be added in place gets storage of
/// its own (no leaf has changed yet). Then the in-place adds.
fn commit(ctx: &ExecContext, order: &[NodeRef], slots: &mut [Slot]) -> Result<()> {
    for (n, s) in order.iter().zip(slots.iter_mut()) {
        if let Slot::Pending(g) = s
            && n.is_leaf()
            && n.commit_needs_copy(g)
        {
            *g = ctx.clone(g)?;
        }
    }
    for (n, s) in order.iter().zip(slots.iter_mut()) {
        if n.is_leaf()
            && let Slot::Pending(g) = std::mem::replace(s, Slot::Empty)
        {
            n.commit(ctx, g)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod size {
    /// The size of one graph node (all of its state is inline, so this is what
    /// a recorded op costs in memory, recycled or not); docs/AUTOGRAD.md quotes it.
    #[test]
    fn node_size() {
        let node = std::mem::size_of::<super::Node>();
        let vjp = std::mem::size_of::<super::Vjp>();
        println!("size_of::<Node>() = {node} bytes, size_of::<Vjp>() = {vjp} bytes");
        // 1,400 bytes with the positional record every op filled in part; the
        // per-op enum is as large as its largest variant (728 on x86_64).
        assert!(
            node <= 768,
            "a graph node grew to {node} bytes: a `Saved` variant got too large"
        );
    }
}
