//! Graph nodes and the backward engine.
//!
//! A node is shared (`Arc`) by the tensor that owns it, by the nodes of the ops
//! that consumed that tensor, and by the exec scope that adopted it. Nodes are
//! numbered from one process-wide counter in creation order; an op's inputs always
//! exist before it, so sorting the reachable nodes by decreasing number gives a
//! valid reverse topological order without any recursion.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use fucina_exec::{Dims, ExecContext, RawTensor};

use crate::error::{AutogradError, Result};

/// The gradients a VJP returns, one per input of the op (`None` where the input
/// needs none or the gradient is identically zero).
pub type Grads = Vec<Option<RawTensor>>;

/// A vector-Jacobian product: given the gradient of the op's output and which
/// inputs need a gradient, the gradient of each input.
pub(crate) type Vjp =
    Box<dyn Fn(&ExecContext, &RawTensor, &[bool]) -> Result<Grads> + Send + Sync + 'static>;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct Node {
    /// Creation number (strictly increasing).
    id: u64,
    /// The shape of the tensor this node belongs to.
    dims: Dims,
    /// The op's inputs (`None` for an input that records no graph); empty for a
    /// leaf variable.
    inputs: Vec<Option<Arc<Node>>>,
    leaf: bool,
    name: &'static str,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The accumulated gradient of a leaf, or the pending gradient of an op
    /// output while backward runs.
    grad: Option<RawTensor>,
    /// The VJP (owns the tensors the op saved for backward).
    vjp: Option<Vjp>,
    /// Set when a backward without `retain_graph` released the VJP.
    consumed: bool,
}

impl Node {
    pub(crate) fn leaf(dims: Dims) -> Arc<Node> {
        Arc::new(Node {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            dims,
            inputs: Vec::new(),
            leaf: true,
            name: "leaf",
            state: Mutex::new(State::default()),
        })
    }

    pub(crate) fn op(
        name: &'static str,
        dims: Dims,
        inputs: Vec<Option<Arc<Node>>>,
        vjp: Vjp,
    ) -> Arc<Node> {
        Arc::new(Node {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            dims,
            inputs,
            leaf: false,
            name,
            state: Mutex::new(State {
                grad: None,
                vjp: Some(vjp),
                consumed: false,
            }),
        })
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

    pub(crate) fn zero_grad(&self) {
        let old = self.lock().grad.take();
        drop(old);
    }

    /// Adds `g` to the node's gradient (never overwrites).
    fn accumulate(&self, ctx: &ExecContext, g: RawTensor, op: &'static str) -> Result<()> {
        if g.shape() != self.dims.as_slice() {
            return Err(AutogradError::GradientShapeMismatch {
                op,
                expected: self.dims,
                got: g.dims(),
            });
        }
        let mut st = self.lock();
        let new = match st.grad.take() {
            None => g,
            // In place when this node holds the only handle (the exec op falls
            // back to a fresh sum otherwise, e.g. while a grad view is alive).
            Some(old) if old.is_contiguous() && old.is_unique() => ctx.take_add_no_grad(old, &g)?,
            Some(old) => {
                let sum = ctx.add(&old, &g);
                match sum {
                    Ok(s) => s,
                    Err(e) => {
                        st.grad = Some(old);
                        return Err(e.into());
                    }
                }
            }
        };
        st.grad = Some(new);
        Ok(())
    }
}

impl Drop for Node {
    /// Releases a chain of nodes iteratively: a graph of any depth drops without
    /// recursion.
    fn drop(&mut self) {
        if self.inputs.is_empty() {
            return;
        }
        let mut stack: Vec<Arc<Node>> = std::mem::take(&mut self.inputs)
            .into_iter()
            .flatten()
            .collect();
        while let Some(n) = stack.pop() {
            if let Some(mut inner) = Arc::into_inner(n) {
                stack.extend(std::mem::take(&mut inner.inputs).into_iter().flatten());
            }
        }
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
    root: &Arc<Node>,
    seed: RawTensor,
    opts: BackwardOptions,
) -> Result<()> {
    if !root.leaf && root.lock().consumed {
        return Err(AutogradError::BackwardAlreadyRun);
    }
    // Collect the reachable nodes iteratively.
    let mut seen: HashSet<u64> = HashSet::new();
    let mut order: Vec<Arc<Node>> = Vec::new();
    let mut stack: Vec<Arc<Node>> = vec![Arc::clone(root)];
    seen.insert(root.id);
    while let Some(n) = stack.pop() {
        for i in n.inputs.iter().flatten() {
            if seen.insert(i.id) {
                stack.push(Arc::clone(i));
            }
        }
        order.push(n);
    }
    // Reverse creation order is a reverse topological order.
    order.sort_unstable_by_key(|n| std::cmp::Reverse(n.id));

    root.accumulate(ctx, seed, "backward")?;
    let result = propagate(ctx, &order, opts);
    if result.is_err() {
        // Drop the pending gradients of op nodes so that a failed backward leaves
        // no partial state behind (leaves keep what they accumulated).
        for n in order.iter().filter(|n| !n.leaf) {
            n.lock().grad = None;
        }
    }
    result
}

fn propagate(ctx: &ExecContext, order: &[Arc<Node>], opts: BackwardOptions) -> Result<()> {
    let mut needs: Vec<bool> = Vec::new();
    for n in order.iter().filter(|n| !n.leaf) {
        let (g, vjp) = {
            let mut st = n.lock();
            let Some(g) = st.grad.take() else { continue };
            if st.consumed {
                return Err(AutogradError::BackwardAlreadyRun);
            }
            let vjp = st.vjp.take();
            if !opts.retain_graph {
                st.consumed = true;
            }
            (g, vjp)
        };
        let Some(vjp) = vjp else {
            return Err(AutogradError::BackwardAlreadyRun);
        };
        needs.clear();
        needs.extend(n.inputs.iter().map(Option::is_some));
        let grads = vjp(ctx, &g, &needs);
        drop(g);
        if opts.retain_graph {
            n.lock().vjp = Some(vjp);
        } else {
            // Releases the tensors the op saved for backward.
            drop(vjp);
        }
        let grads = grads?;
        if grads.len() != n.inputs.len() {
            return Err(AutogradError::GradientCountMismatch {
                op: n.name,
                expected: n.inputs.len(),
                got: grads.len(),
            });
        }
        for (input, gi) in n.inputs.iter().zip(grads) {
            if let (Some(input), Some(gi)) = (input, gi) {
                input.accumulate(ctx, gi, n.name)?;
            }
        }
    }
    Ok(())
}
