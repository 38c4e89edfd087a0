//! [`Sequential`]: a chain of layers.

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use std::any::Any;

use fucina_exec::Pool2dOptions;

use super::{Buffer, Forward, MaxPool2d, Module, Parameter, Relu, prefixed};
use crate::error::Result;

/// What [`Sequential`] knows of a layer for fusing neighbours: a [`Relu`]
/// followed by a [`MaxPool2d`] runs as one fused op.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Relu,
    MaxPool(Pool2dOptions),
    Other,
}

impl Kind {
    fn of<L: Any>(layer: &L) -> Kind {
        let any: &dyn Any = layer;
        if any.is::<Relu>() {
            Kind::Relu
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
/// A [`Relu`] directly followed by a [`MaxPool2d`] runs as one fused op
/// ([`Tensor::relu_max_pool2d`]): the same values and gradients, bit for bit, in
/// one pass over the activation instead of three (an error from the pair then
/// names `relu_max_pool2d`).
#[derive(Default)]
pub struct Sequential {
    layers: Vec<(String, Box<dyn Forward + Send + Sync>)>,
    kinds: Vec<Kind>,
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
