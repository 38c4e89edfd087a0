//! Layers: [`Linear`], [`Embedding`], [`LayerNorm`], [`RmsNorm`],
//! [`GroupNorm`], [`InstanceNorm1d`], [`InstanceNorm2d`], [`Dropout`], [`Identity`], activations, [`Sequential`] composition, the
//! recurrent layers [`Lstm`] and [`Gru`] and their one-step cells [`LstmCell`] and [`GruCell`], [`MultiheadAttention`], the losses
//! [`l1_loss`], [`smooth_l1_loss`], [`huber_loss`], [`binary_cross_entropy`],
//! [`binary_cross_entropy_with_logits`], [`kl_div`], [`cross_entropy_with`] and
//! [`nll_loss_with`] (PyTorch's, with a [`Reduction`]), PyTorch's
//! [`TransformerEncoderLayer`] and [`TransformerDecoderLayer`], a small transformer
//! ([`CausalSelfAttention`], [`Block`]), and the layers of convolutional
//! networks ([`Conv1d`], [`Conv2d`], [`ConvTranspose1d`], [`ConvTranspose2d`],
//! [`BatchNorm1d`], [`BatchNorm2d`], [`MaxPool2d`], [`AvgPool2d`],
//! [`AdaptiveAvgPool2d`], [`Flatten`], [`MaxPool1d`], [`AvgPool1d`],
//! [`Upsample`], and the padding layers [`ZeroPad2d`], [`ZeroPad3d`],
//! [`ConstantPad1d`], [`ConstantPad2d`], [`ConstantPad3d`],
//! [`ReflectionPad1d`], [`ReflectionPad2d`], [`ReflectionPad3d`],
//! [`ReplicationPad1d`], [`ReplicationPad2d`], [`ReplicationPad3d`]).
//!
//! Non-trainable state a layer saves with its weights (batch norm's running
//! statistics) lives in [`Buffer`]s, listed by [`Module::named_buffers`] and
//! included in [`Module::state_dict`] and the checkpoints.
//!
//! Every layer holds its weights as [`Parameter`]s: shared handles to a leaf
//! variable. Cloning a `Parameter` gives another handle to the *same* parameter,
//! so the handles an optimizer holds and the ones the layer reads in `forward`
//! see the same values after every step. [`Module::named_parameters`] lists them
//! with stable dotted names (`"fc1.weight"`, `"0.bias"`, `"blocks.1.attn.qkv.weight"`).
//!
//! Layers check the shape of their input and return
//! [`crate::Error::ShapeMismatch`] naming the layer when it does not fit; nothing panics on bad input.
//!
//! ```
//! use fucina::nn::{Forward, Linear, Module, Relu, Sequential};
//! use fucina::{ExecContext, Tensor};
//!
//! let ctx = ExecContext::new();
//! let mlp = Sequential::new()
//!     .push(Linear::new(&ctx, 4, 8, 1)?)
//!     .push(Relu)
//!     .push(Linear::new(&ctx, 8, 2, 2)?);
//! let names: Vec<String> = mlp.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
//! let x = Tensor::from_slice(&ctx, &[3, 4], &[0.5; 12])?;
//! assert_eq!(mlp.forward(&ctx, &x)?.shape(), [3, 2]);
//! assert!(mlp.forward(&ctx, &Tensor::zeros(&ctx, &[3, 5])?).is_err()); // 5 features, not 4
//! # Ok::<(), fucina::Error>(())
//! ```

/// `Module` (no parameters) and `Forward` (the type's inherent `forward`)
/// for a layer without parameters: `parameterless_layer!(Type)`.
macro_rules! parameterless_layer {
    ($name:ident) => {
        impl $crate::nn::Module for $name {
            fn named_parameters(&self) -> Vec<(String, $crate::nn::Parameter)> {
                Vec::new()
            }
        }

        impl $crate::nn::Forward for $name {
            fn forward(
                &self,
                ctx: &fucina_exec::ExecContext,
                x: &fucina_autograd::Tensor,
            ) -> $crate::Result<fucina_autograd::Tensor> {
                $name::forward(self, ctx, x)
            }
        }
    };
}

mod attention;
mod buffer;
mod conv;
mod conv_transpose;
mod instance_norm;
mod layers;
mod losses;
mod multihead_attention;
mod parameter;
mod recurrent;
mod resize;
mod sequential;
mod state_dict;
mod transformer;

pub use attention::{Block, CausalSelfAttention, Mlp};
pub use buffer::Buffer;
pub use conv::{
    AdaptiveAvgPool2d, AvgPool1d, AvgPool2d, BatchNorm1d, BatchNorm2d, Conv1d, Conv2d, Flatten,
    MaxPool1d, MaxPool2d,
};
pub use conv_transpose::{ConvTranspose1d, ConvTranspose2d};
/// `#[derive(Module)]`: implements [`Module`] for a struct from its fields
/// (see the trait's documentation).
pub use fucina_derive::Module;
pub use instance_norm::{Identity, InstanceNorm1d, InstanceNorm2d};
pub use layers::{
    Dropout, Embedding, Gelu, GroupNorm, Hardswish, LayerNorm, Linear, LogSigmoid, Mish, Relu,
    RmsNorm, Sigmoid, Silu, Softplus, Tanh,
};
pub use losses::{
    ClassLossOptions, Reduction, binary_cross_entropy, binary_cross_entropy_with_logits,
    cross_entropy_with, huber_loss, kl_div, l1_loss, nll_loss_with, smooth_l1_loss,
};
pub use multihead_attention::{AttentionOptions, AttnMask, MultiheadAttention};
pub use parameter::Parameter;
pub use recurrent::{Gru, GruCell, Lstm, LstmCell, RnnOptions, gru, lstm};
pub use resize::{
    ConstantPad1d, ConstantPad2d, ConstantPad3d, ReflectionPad1d, ReflectionPad2d, ReflectionPad3d,
    ReplicationPad1d, ReplicationPad2d, ReplicationPad3d, Upsample, ZeroPad2d, ZeroPad3d,
};
pub use sequential::Sequential;
pub use state_dict::StateDict;
pub use transformer::{
    TransformerActivation, TransformerDecoderLayer, TransformerEncoderLayer, TransformerOptions,
};

use std::collections::HashMap;

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use crate::error::{Error, Result};

/// Something with parameters: lists them with stable names and switches
/// between training and evaluation behaviour.
///
/// `#[derive(Module)]` implements it for a struct from its fields: a
/// [`Parameter`] field is one parameter named after the field, a module field
/// gives its parameters under `"field."`, a `Vec` or array field numbers its
/// elements (`"layers.0.weight"`), an `Option` field counts when present, a
/// `Box` field is looked through, and `#[module(skip)]` marks a field without
/// parameters. [`train`](Module::train) is passed on to every module field.
///
/// ```
/// use fucina::nn::{Linear, Module, Parameter};
/// use fucina::ExecContext;
///
/// #[derive(Module)]
/// struct Mlp {
///     layers: Vec<Linear>,
///     gain: Parameter,
///     #[module(skip)]
///     width: usize,
/// }
///
/// let ctx = ExecContext::new();
/// let mlp = Mlp {
///     layers: vec![Linear::new(&ctx, 2, 4, 1)?, Linear::new(&ctx, 4, 1, 2)?],
///     gain: Parameter::from_slice(&ctx, &[1], &[1.0])?,
///     width: 4,
/// };
/// let names: Vec<String> = mlp.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names, ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "gain"]);
/// # let _ = mlp.width;
/// # Ok::<(), fucina::Error>(())
/// ```
pub trait Module {
    /// The parameters with stable dotted names, in a fixed order (the order of
    /// [`parameters`](Module::parameters)).
    fn named_parameters(&self) -> Vec<(String, Parameter)>;

    /// The parameters (handles sharing each parameter: updating one is seen by
    /// the layer).
    fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters()
            .into_iter()
            .map(|(_, p)| p)
            .collect()
    }

    /// The non-trainable state saved with the parameters ([`Buffer`]s, such as
    /// batch normalization's running statistics) with stable dotted names, in
    /// a fixed order. None by default; `#[derive(Module)]` gathers them from
    /// the fields.
    fn named_buffers(&self) -> Vec<(String, Buffer)> {
        Vec::new()
    }

    /// Switches training mode (`true`, the default) or evaluation mode
    /// (`false`: dropout passes its input through, batch normalization uses
    /// its running statistics). Containers pass it on.
    fn train(&mut self, training: bool) {
        let _ = training;
    }

    /// Evaluation mode: `train(false)`.
    fn eval(&mut self) {
        self.train(false);
    }

    /// Releases every parameter's gradient.
    fn zero_grad(&self) {
        for p in self.parameters() {
            p.zero_grad();
        }
    }

    /// The total number of parameter elements.
    fn num_parameters(&self) -> usize {
        self.parameters().iter().map(Parameter::numel).sum()
    }

    /// The parameters, then the buffers, as a [`StateDict`] (names of
    /// [`named_parameters`](Module::named_parameters) and
    /// [`named_buffers`](Module::named_buffers), detached handles sharing the
    /// values: no copy). The names are taken as the module reports them: a
    /// hand-written `named_parameters` that repeats a name gives a state dict
    /// that loading and saving refuse, naming it.
    fn state_dict(&self) -> StateDict {
        let mut entries: Vec<(String, Tensor)> = self
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, p.tensor().detach()))
            .collect();
        entries.extend(
            self.named_buffers()
                .into_iter()
                .map(|(n, b)| (n, b.tensor())),
        );
        StateDict::from_unique(entries)
    }

    /// Copies the values of `state` into the parameters and buffers by name:
    /// the checks of [`load_parameters`](Module::load_parameters) (every
    /// parameter and buffer present once with its shape, no unknown name), all
    /// before the first write.
    ///
    /// # Errors
    /// [`Error::StateDict`] naming the entry that does not fit (nothing
    /// changes); out of memory.
    fn load_state_dict(&self, state: &StateDict) -> Result<()> {
        let mut targets: Vec<(String, Target)> = self
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, Target::Parameter(p)))
            .collect();
        targets.extend(
            self.named_buffers()
                .into_iter()
                .map(|(n, b)| (n, Target::Buffer(b))),
        );
        load_named(&targets, state)
    }

    /// Copies values into the parameters by name (the names of
    /// [`named_parameters`](Module::named_parameters)). Every entry is checked
    /// first (each parameter present exactly once, with its shape; no unknown
    /// name): a list that does not fit is an error and changes nothing.
    ///
    /// # Errors
    /// [`Error::StateDict`] naming the missing, unknown, duplicate or
    /// misshapen entry; out of memory.
    fn load_parameters(&self, named: &[(String, Tensor)]) -> Result<()> {
        let targets: Vec<(String, Target)> = self
            .named_parameters()
            .into_iter()
            .map(|(n, p)| (n, Target::Parameter(p)))
            .collect();
        load_named(&targets, named)
    }
}

/// Where a loaded value goes.
enum Target {
    Parameter(Parameter),
    Buffer(Buffer),
}

impl Target {
    fn shape(&self) -> fucina_exec::Dims {
        match self {
            Target::Parameter(p) => p.shape(),
            Target::Buffer(b) => b.shape(),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Target::Parameter(_) => "parameter",
            Target::Buffer(_) => "buffer",
        }
    }
}

/// Copies `named` into `mine` by name after checking every entry (each target
/// present exactly once, with its shape; no unknown name).
fn load_named(mine: &[(String, Target)], named: &[(String, Tensor)]) -> Result<()> {
    // Name -> position in `named`: one pass, so loading is linear in the
    // number of entries (a large model has thousands).
    let mut given: HashMap<&str, usize> = HashMap::with_capacity(named.len());
    let index: HashMap<&str, usize> = mine
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.as_str(), i))
        .collect();
    for (i, (name, t)) in named.iter().enumerate() {
        let Some(&at) = index.get(name.as_str()) else {
            return Err(Error::StateDict {
                reason: format!("unknown parameter \"{name}\""),
            });
        };
        let p = &mine[at].1;
        if given.insert(name.as_str(), i).is_some() {
            return Err(Error::StateDict {
                reason: format!("duplicate {} \"{name}\"", p.kind()),
            });
        }
        if t.shape() != p.shape().as_slice() {
            return Err(Error::StateDict {
                reason: format!(
                    "{} \"{name}\" has shape {:?} in the list, {:?} in the model",
                    p.kind(),
                    t.shape(),
                    p.shape().as_slice()
                ),
            });
        }
    }
    if let Some((name, p)) = mine.iter().find(|(n, _)| !given.contains_key(n.as_str())) {
        return Err(Error::StateDict {
            reason: format!("missing {} \"{name}\"", p.kind()),
        });
    }
    for (name, p) in mine {
        let values = named[given[name.as_str()]].1.to_vec();
        match p {
            Target::Parameter(p) => p.copy_from_slice(&values)?,
            Target::Buffer(b) => b.copy_from_slice(&values)?,
        }
    }
    Ok(())
}

/// A module that maps one tensor to one tensor (what [`Sequential`] chains).
pub trait Forward: Module {
    /// Applies the module.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if `x` does not fit the module; the errors of
    /// the ops it runs.
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor>;
}

/// A seed for the `k`-th sub-stream of `seed` (layers derive the seeds of their
/// parts with it: a pure function, so the same seed builds the same model).
pub fn sub_seed(seed: u64, k: u64) -> u64 {
    fucina_rng::at(seed ^ 0x006E_6E5E_ED0F_F5E7, k)
}

/// Prefixes every name with `prefix.`: the names of a part of a module, as
/// [`Module::named_parameters`] of a composite reports them.
pub fn prefixed(prefix: &str, named: Vec<(String, Parameter)>) -> Vec<(String, Parameter)> {
    named
        .into_iter()
        .map(|(n, p)| (format!("{prefix}.{n}"), p))
        .collect()
}

/// Checks that `x`'s last dimension is `want`.
pub(crate) fn check_last_dim(
    layer: impl FnOnce() -> String,
    x: &Tensor,
    want: usize,
) -> Result<()> {
    let shape = x.shape();
    match shape.last() {
        Some(&d) if d == want => Ok(()),
        _ => Err(Error::ShapeMismatch {
            layer: layer(),
            got: shape.to_vec(),
            reason: format!("the last dimension must be {want}"),
        }),
    }
}

/// The named parameters of a layer with a `weight` and an optional `bias`
/// (`Linear`, `Conv1d`, `Conv2d`), in that order.
pub(crate) fn weight_and_bias(
    weight: &Parameter,
    bias: Option<&Parameter>,
) -> Vec<(String, Parameter)> {
    let mut v = vec![("weight".to_string(), weight.clone())];
    if let Some(b) = bias {
        v.push(("bias".to_string(), b.clone()));
    }
    v
}

/// Checks a size argument of a constructor.
pub(crate) fn check_size(what: &'static str, name: &str, v: usize) -> Result<()> {
    if v == 0 {
        return Err(Error::invalid(
            what,
            format!("{name} must be at least 1 (got 0)"),
        ));
    }
    Ok(())
}
