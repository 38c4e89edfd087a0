//! [`Sequential`]: a chain of layers.

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use std::any::Any;

use fucina_exec::{Pool2dOp, Pool2dOptions};

use super::{BatchNorm2d, Buffer, Forward, MaxPool2d, Module, Parameter, Relu, prefixed};
use crate::error::Result;

/// What [`Sequential`] knows of a layer for fusing neighbours (see
/// [`Sequential`]'s docs for the patterns).
#[derive(Clone, Copy, Debug)]
enum Kind {
    Relu,
    MaxPool(Pool2dOptions),
    BatchNorm2d,
    Other,
}

impl Kind {
    fn of<L: Any>(layer: &L) -> Kind {
        let any: &dyn Any = layer;
        if any.is::<Relu>() {
            Kind::Relu
        } else if any.is::<BatchNorm2d>() {
            Kind::BatchNorm2d
        } else if let Some(p) = any.downcast_ref::<MaxPool2d>() {
            Kind::MaxPool(p.options())
        } else {
            Kind::Other
        }
    }
}

/// Layers applied in order. A layer's parameters are named after its position
/// (`"0.weight"`, `"2.bias"`, as PyTorch's `nn.Sequential` names them) or after
/// the name given to [`push_named`](Sequential::push_named).
///
/// Neighbours that stream a full-resolution activation through memory run as
/// one fused op, with the same values and gradients, bit for bit:
/// - a [`BatchNorm2d`], a [`Relu`] and a [`MaxPool2d`] run as
///   [`BatchNorm2d::forward_pool2d`] (in training mode,
///   [`Tensor::batch_norm_pool2d_with_stats`]: neither the normalized tensor
///   nor the pool's full-resolution gradient is ever written); a
///   [`BatchNorm2d`] directly followed by a [`MaxPool2d`] likewise;
/// - otherwise a [`Relu`] directly followed by a [`MaxPool2d`] runs as
///   [`Tensor::relu_max_pool2d`] (one pass over the activation instead of
///   three).
///
/// An error from a fused group names the fused op.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<(String, Box<dyn Layer>)>,
    kinds: Vec<Kind>,
}

/// A layer in a [`Sequential`]: [`Forward`], and reachable as its concrete type
/// (for the fused groups).
trait Layer: Forward + Send + Sync {
    fn as_any(&self) -> &dyn Any;
}

impl<T: Forward + Send + Sync + 'static> Layer for T {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl std::fmt::Debug for Sequential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.layers.iter().map(|(n, _)| n))
            .finish()
    }
}

impl Sequential {
    /// An empty chain (the identity).
    pub fn new() -> Sequential {
        Sequential::default()
    }

    /// Appends `layer`, named by its position.
    pub fn push(self, layer: impl Forward + Send + Sync + 'static) -> Sequential {
        let name = self.layers.len().to_string();
        self.push_named(name, layer)
    }

    /// Appends `layer` under `name`.
    pub fn push_named(
        mut self,
        name: impl Into<String>,
        layer: impl Forward + Send + Sync + 'static,
    ) -> Sequential {
        self.kinds.push(Kind::of(&layer));
        self.layers.push((name.into(), Box::new(layer)));
        self
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether the chain is empty.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn named_parameters(&self) -> Vec<(String, Parameter)> {
        self.layers
            .iter()
            .flat_map(|(n, l)| prefixed(n, l.named_parameters()))
            .collect()
    }

    fn named_buffers(&self) -> Vec<(String, Buffer)> {
        self.layers
            .iter()
            .flat_map(|(n, l)| {
                l.named_buffers()
                    .into_iter()
                    .map(move |(k, b)| (format!("{n}.{k}"), b))
            })
            .collect()
    }

    fn train(&mut self, training: bool) {
        for (_, l) in &mut self.layers {
            l.train(training);
        }
    }
}

impl Forward for Sequential {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        let mut i = 0;
        while i < self.layers.len() {
            let next = |k: usize| self.kinds.get(i + k).copied();
            if let Kind::BatchNorm2d = self.kinds[i] {
                let fused = match (next(1), next(2)) {
                    (Some(Kind::Relu), Some(Kind::MaxPool(o))) => Some((Pool2dOp::ReluMax(o), 3)),
                    (Some(Kind::MaxPool(o)), _) => Some((Pool2dOp::Max(o), 2)),
                    _ => None,
                };
                let bn = self.layers[i].1.as_any().downcast_ref::<BatchNorm2d>();
                if let (Some((op, span)), Some(bn)) = (fused, bn) {
                    h = bn.forward_pool2d(ctx, &h, op)?;
                    i += span;
                    continue;
                }
            }
            if let (Kind::Relu, Some(&Kind::MaxPool(o))) = (self.kinds[i], self.kinds.get(i + 1)) {
                h = h.relu_max_pool2d(ctx, o)?;
                i += 2;
                continue;
            }
            h = self.layers[i].1.forward(ctx, &h)?;
            i += 1;
        }
        Ok(h)
    }
}
