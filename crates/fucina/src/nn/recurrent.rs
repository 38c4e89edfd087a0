//! The recurrent layers [`Lstm`] and [`Gru`] (PyTorch's `nn.LSTM` and
//! `nn.GRU`: its gate order, parameter names and init, several layers, both
//! directions, `batch_first`), their functional forms [`lstm`] and [`gru`],
//! and the one-step cells [`LstmCell`] and [`GruCell`].
//!
//! Each layer and direction of [`Lstm`] and [`Gru`] is one differentiable
//! sequence node ([`Tensor::lstm_sequence`], [`Tensor::gru_sequence`]) on
//! the flat weight of its parameters ([`Tensor::rnn_flat_weight`]): the
//! input's projection of every step is one GEMM, `W_hh` is packed once for
//! the sequence, the steps run the fused cell; the backward runs the steps
//! in reverse and ends with one GEMM each for the input's and the weights'
//! gradients. The forward has the bits of the step-by-step loop of `linear`
//! and the fused cells [`Tensor::lstm_cell`] and [`Tensor::gru_cell`] (which
//! the cells [`LstmCell`] and [`GruCell`] run, for users who step by hand).

use fucina_autograd::Tensor;
use fucina_exec::ExecContext;

use super::{Forward, Module, Parameter, check_size, sub_seed};
use crate::error::{Error, Result};

/// The configuration of a recurrent layer besides its sizes (PyTorch's
/// `num_layers`, `bias`, `batch_first` and `bidirectional` arguments).
/// `Default` is PyTorch's: one layer, with biases, sequence-first `[T, B,
/// features]`, one direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RnnOptions {
    /// Stacked layers (at least 1): layer `k + 1` reads layer `k`'s output.
    pub num_layers: usize,
    /// Whether each layer has the biases `bias_ih` and `bias_hh`.
    pub bias: bool,
    /// Input and output as `[B, T, features]` instead of `[T, B, features]`
    /// (the states stay `[layers * directions, B, hidden]`, as in PyTorch).
    pub batch_first: bool,
    /// A second pass over each layer from the last step to the first; the
    /// output holds both directions' states (`2 * hidden` features).
    pub bidirectional: bool,
}

impl Default for RnnOptions {
    fn default() -> Self {
        RnnOptions {
            num_layers: 1,
            bias: true,
            batch_first: false,
            bidirectional: false,
        }
    }
}

impl RnnOptions {
    fn directions(self) -> usize {
        if self.bidirectional { 2 } else { 1 }
    }
    /// Tensors per layer and direction: the two weights and, with biases, the
    /// two biases.
    fn per_cell(self) -> usize {
        if self.bias { 4 } else { 2 }
    }
}

/// LSTM or GRU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    Lstm,
    Gru,
}

impl Cell {
    /// The gate blocks of the weights' rows: LSTM `i, f, g, o`, GRU `r, z, n`.
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Cell::Lstm => "lstm",
            Cell::Gru => "gru",
        }
    }
}

/// PyTorch's parameter names, in its order: for each layer `k` and direction
/// (`""`, then `"_reverse"`), `weight_ih_lk`, `weight_hh_lk`, `bias_ih_lk`,
/// `bias_hh_lk`.
fn parameter_names(opts: RnnOptions) -> Vec<String> {
    let mut names = Vec::new();
    for k in 0..opts.num_layers {
        for d in 0..opts.directions() {
            let suffix = if d == 1 { "_reverse" } else { "" };
            let kinds: &[&str] = if opts.bias {
                &["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
            } else {
                &["weight_ih", "weight_hh"]
            };
            for kind in kinds {
                names.push(format!("{kind}_l{k}{suffix}"));
            }
        }
    }
    names
}

/// The expected shape of the `i`-th tensor of [`parameter_names`]' list.
fn parameter_shape(
    cell: Cell,
    input: usize,
    hidden: usize,
    opts: RnnOptions,
    i: usize,
) -> Vec<usize> {
    let rows = cell.gates() * hidden;
    let layer = i / (opts.per_cell() * opts.directions());
    let in_k = if layer == 0 {
        input
    } else {
        hidden * opts.directions()
    };
    match i % opts.per_cell() {
        0 => vec![rows, in_k],
        1 => vec![rows, hidden],
        _ => vec![rows],
    }
}

/// Checks the input, the weights and the initial states of a forward.
fn check_forward(
    cell: Cell,
    x: &Tensor,
    states: &[Option<&Tensor>],
    weights: &[Tensor],
    hidden: usize,
    opts: RnnOptions,
) -> Result<()> {
    let what = cell.name();
    let mismatch = |got: &[usize], reason: String| Error::ShapeMismatch {
        layer: what.to_string(),
        got: got.to_vec(),
        reason,
    };
    check_size(what, "hidden_size", hidden)?;
    check_size(what, "num_layers", opts.num_layers)?;
    let s = x.shape();
    if s.len() != 3 {
        let layout = if opts.batch_first {
            "[batch, steps, features]"
        } else {
            "[steps, batch, features]"
        };
        return Err(mismatch(s, format!("the input must be 3-D {layout}")));
    }
    let batch = if opts.batch_first { s[0] } else { s[1] };
    let input = s[2];
    let count = opts.num_layers * opts.directions() * opts.per_cell();
    if weights.len() != count {
        return Err(Error::invalid(
            what,
            format!(
                "{count} weight tensors expected ({:?}), got {}",
                parameter_names(opts),
                weights.len()
            ),
        ));
    }
    let names = parameter_names(opts);
    for (i, w) in weights.iter().enumerate() {
        let want = parameter_shape(cell, input, hidden, opts, i);
        if w.shape() != want.as_slice() {
            return Err(mismatch(
                w.shape(),
                format!("{} must be {want:?}", names[i]),
            ));
        }
    }
    let want = [opts.num_layers * opts.directions(), batch, hidden];
    for st in states.iter().flatten() {
        if st.shape() != want {
            return Err(mismatch(
                st.shape(),
                format!("an initial state must be [layers * directions, batch, hidden] = {want:?}"),
            ));
        }
    }
    Ok(())
}

/// The layer `l`, direction `d` slice (`idx = l * dirs + d`) of an initial
/// state, or zeros.
fn initial(
    ctx: &ExecContext,
    state: Option<&Tensor>,
    idx: usize,
    batch: usize,
    hidden: usize,
) -> Result<Tensor> {
    match state {
        Some(s) => Ok(s.narrow(ctx, 0, idx, 1)?.squeeze(ctx, 0)?),
        None => Ok(Tensor::zeros(ctx, &[batch, hidden])?),
    }
}

/// One direction of one layer over the whole sequence `input` (`[T, B,
/// features]`): the fused [`Tensor::lstm_sequence`] or
/// [`Tensor::gru_sequence`] on the flat weight of the direction's
/// parameters `w`. Returns the output `[T, B, H]`, the final `h` and (LSTM)
/// the final `c`.
#[allow(clippy::too_many_arguments)]
fn direction(
    ctx: &ExecContext,
    cell: Cell,
    input: &Tensor,
    w: &[Tensor],
    [h0, c0]: [Option<&Tensor>; 2],
    idx: usize,
    hidden: usize,
    reverse: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (steps, batch) = (input.shape()[0], input.shape()[1]);
    let biases = (w.len() == 4).then(|| (&w[2], &w[3]));
    let flat = Tensor::rnn_flat_weight(ctx, &w[0], &w[1], biases)?;
    let h = initial(ctx, h0, idx, batch, hidden)?;
    let last = if reverse { 0 } else { steps - 1 };
    match cell {
        Cell::Lstm => {
            let state = match (h0, c0) {
                (None, None) => Tensor::zeros(ctx, &[2, batch, hidden])?,
                _ => {
                    let c = initial(ctx, c0, idx, batch, hidden)?;
                    Tensor::stack(ctx, &[&h, &c], 0)?
                }
            };
            let out = input.lstm_sequence(ctx, &flat, &state, reverse)?;
            let y = out.narrow(ctx, 0, 0, steps)?;
            let h_n = y.narrow(ctx, 0, last, 1)?.squeeze(ctx, 0)?;
            let c_n = out.narrow(ctx, 0, steps, 1)?.squeeze(ctx, 0)?;
            Ok((y, h_n, c_n))
        }
        Cell::Gru => {
            let y = input.gru_sequence(ctx, &flat, &h, reverse)?;
            let h_n = y.narrow(ctx, 0, last, 1)?.squeeze(ctx, 0)?;
            Ok((y, h_n.clone(), h_n))
        }
    }
}

/// The forward of both kinds from the initial `[h0, c0]` (`c0` for the LSTM
/// only): the output `[T, B, dirs * H]` (or batch-first) and the final `h`
/// and (LSTM) `c`, `[layers * dirs, B, H]` each. Each layer and direction is
/// one sequence node; the two directions' outputs are concatenated along the
/// features for the next layer.
fn run(
    ctx: &ExecContext,
    cell: Cell,
    x: &Tensor,
    [h0, c0]: [Option<&Tensor>; 2],
    weights: &[Tensor],
    hidden: usize,
    opts: RnnOptions,
) -> Result<(Tensor, Tensor, Option<Tensor>)> {
    check_forward(cell, x, &[h0, c0], weights, hidden, opts)?;
    let mut input = if opts.batch_first {
        x.transpose(ctx, 0, 1)?.materialize(ctx)?
    } else {
        x.clone()
    };
    let dirs = opts.directions();
    let (mut hs, mut cs) = (Vec::new(), Vec::new());
    for layer in 0..opts.num_layers {
        let mut outs: Vec<Tensor> = Vec::with_capacity(dirs);
        for d in 0..dirs {
            let idx = layer * dirs + d;
            let w = &weights[idx * opts.per_cell()..][..opts.per_cell()];
            let (y, h, c) = direction(ctx, cell, &input, w, [h0, c0], idx, hidden, d == 1)?;
            outs.push(y);
            hs.push(h);
            cs.push(c);
        }
        input = if dirs == 2 {
            Tensor::concat(ctx, &[&outs[0], &outs[1]], 2)?
        } else {
            outs.swap_remove(0)
        };
    }
    let output = if opts.batch_first {
        input.transpose(ctx, 0, 1)?.materialize(ctx)?
    } else {
        input
    };
    let stack = |v: &[Tensor]| -> Result<Tensor> {
        let refs: Vec<&Tensor> = v.iter().collect();
        Ok(Tensor::stack(ctx, &refs, 0)?)
    };
    let h_n = stack(&hs)?;
    let c_n = match cell {
        Cell::Lstm => Some(stack(&cs)?),
        Cell::Gru => None,
    };
    Ok((output, h_n, c_n))
}

/// The LSTM over a sequence, PyTorch's functional LSTM: `x` is `[T, B, in]`
/// (`[B, T, in]` with `batch_first`), `state` the initial `(h_0, c_0)`
/// (`[layers * directions, B, hidden]` each; zeros when `None`) and
/// `weights` the tensors of [`Lstm::named_parameters`] in that order
/// (`weight_ih_l0 [4H, in]`, `weight_hh_l0 [4H, H]`, `bias_ih_l0 [4H]`,
/// `bias_hh_l0 [4H]`, then the reverse direction and the next layers). Each
/// step computes PyTorch's cell with the gates in its order `i, f, g, o`:
/// `i = σ(·)`, `f = σ(·)`, `g = tanh(·)`, `o = σ(·)`, `c' = f * c + i * g`,
/// `h' = o * tanh(c')`. Returns the output (`[T, B, directions * hidden]`,
/// or batch-first: every step's `h`, the directions side by side) and the
/// final `(h_n, c_n)`.
///
/// # Errors
/// [`Error::ShapeMismatch`] for an input that is not 3-D, a weight or state
/// of the wrong shape; [`Error::InvalidArgument`] for a zero `hidden` or
/// layer count or the wrong number of weights; the ops' errors.
pub fn lstm(
    ctx: &ExecContext,
    x: &Tensor,
    state: Option<(&Tensor, &Tensor)>,
    weights: &[Tensor],
    hidden: usize,
    opts: RnnOptions,
) -> Result<(Tensor, (Tensor, Tensor))> {
    let (h0, c0) = state.unzip();
    let (out, h, c) = run(ctx, Cell::Lstm, x, [h0, c0], weights, hidden, opts)?;
    let c = c.expect("an LSTM has a cell state");
    Ok((out, (h, c)))
}

/// The GRU over a sequence, PyTorch's functional GRU: as [`lstm`] with the
/// gates `r, z, n` (`weight_ih_l0` is `[3H, in]`) and one state `h`: `r =
/// σ(x W_irᵀ + b_ir + h W_hrᵀ + b_hr)`, `z` likewise, `n = tanh(x W_inᵀ + b_in
/// + r * (h W_hnᵀ + b_hn))`, `h' = (1 - z) * n + z * h`. Returns the output
/// and the final `h_n`.
///
/// # Errors
/// As [`lstm`].
pub fn gru(
    ctx: &ExecContext,
    x: &Tensor,
    h0: Option<&Tensor>,
    weights: &[Tensor],
    hidden: usize,
    opts: RnnOptions,
) -> Result<(Tensor, Tensor)> {
    let (out, h, _) = run(ctx, Cell::Gru, x, [h0, None], weights, hidden, opts)?;
    Ok((out, h))
}

/// The state and forward shared by [`Lstm`] and [`Gru`].
#[derive(Debug, Clone)]
struct Recurrent {
    cell: Cell,
    params: Vec<(String, Parameter)>,
    input: usize,
    hidden: usize,
    opts: RnnOptions,
}

impl Recurrent {
    /// A layer of kind `cell` with its parameters in PyTorch's order, each
    /// `U(-k, k)` with `k = 1/sqrt(hidden)` (PyTorch's default), drawn from
    /// `sub_seed(seed, i)` for the `i`-th.
    fn new(
        ctx: &ExecContext,
        cell: Cell,
        what: &'static str,
        input: usize,
        hidden: usize,
        opts: RnnOptions,
        seed: u64,
    ) -> Result<Recurrent> {
        check_size(what, "input_size", input)?;
        check_size(what, "hidden_size", hidden)?;
        check_size(what, "num_layers", opts.num_layers)?;
        let k = (1.0 / hidden as f64).sqrt() as f32;
        let params = parameter_names(opts)
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let shape = parameter_shape(cell, input, hidden, opts, i);
                let t = Tensor::uniform(ctx, &shape, -k, k, sub_seed(seed, i as u64))?;
                Ok((name, Parameter::new(t)))
            })
            .collect::<Result<_>>()?;
        Ok(Recurrent {
            cell,
            params,
            input,
            hidden,
            opts,
        })
    }
    fn weights(&self) -> Vec<Tensor> {
        self.params.iter().map(|(_, p)| p.tensor()).collect()
    }
    fn describe(&self) -> String {
        let name = match self.cell {
            Cell::Lstm => "LSTM",
            Cell::Gru => "GRU",
        };
        format!(
            "{name}(input = {}, hidden = {}, {:?})",
            self.input, self.hidden, self.opts
        )
    }
    /// Refuses an input whose feature count is not the layer's (with the
    /// layer's description).
    fn check_input(&self, x: &Tensor) -> Result<()> {
        let s = x.shape();
        if s.len() != 3 || s[2] != self.input {
            let layout = if self.opts.batch_first {
                "[batch, steps, features]"
            } else {
                "[steps, batch, features]"
            };
            return Err(Error::ShapeMismatch {
                layer: self.describe(),
                got: s.to_vec(),
                reason: format!("the input must be {layout} with {} features", self.input),
            });
        }
        Ok(())
    }
}

/// The accessors and the `Module` impl that [`Lstm`] and [`Gru`] share
/// (both wrap a [`Recurrent`]).
macro_rules! recurrent_common {
    ($t:ident) => {
        impl $t {
            /// The input features.
            pub fn input_size(&self) -> usize {
                self.inner.input
            }

            /// The hidden state size (for the LSTM, also the cell state's).
            pub fn hidden_size(&self) -> usize {
                self.inner.hidden
            }

            /// The layers, biases, layout and directions.
            pub fn options(&self) -> RnnOptions {
                self.inner.opts
            }
        }

        impl Module for $t {
            fn named_parameters(&self) -> Vec<(String, Parameter)> {
                self.inner.params.clone()
            }
        }
    };
}

/// A multi-layer LSTM, PyTorch's `nn.LSTM(input_size, hidden_size,
/// num_layers, bias, batch_first, bidirectional=...)`: the parameters
/// `weight_ih_l{k}` (`[4 * hidden, in]`), `weight_hh_l{k}` (`[4 * hidden,
/// hidden]`), `bias_ih_l{k}` and `bias_hh_l{k}` (`[4 * hidden]`), with
/// `_reverse` copies for the second direction, the gates in PyTorch's order
/// `i, f, g, o`, each `U(-1/sqrt(hidden), 1/sqrt(hidden))`, so a PyTorch
/// state dict loads as it is. See [`lstm`] for the computation. Not
/// supported: `dropout` between layers and `proj_size`.
///
/// ```
/// use fucina::nn::{Lstm, Module, RnnOptions};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let opts = RnnOptions { num_layers: 2, batch_first: true, ..Default::default() };
/// let lstm = Lstm::new(&ctx, 3, 5, opts, 1)?;
/// let x = Tensor::zeros(&ctx, &[4, 7, 3])?; // [batch, steps, features]
/// let (y, (h, c)) = lstm.forward(&ctx, &x, None)?;
/// assert_eq!(y.shape(), [4, 7, 5]);
/// assert_eq!(h.shape(), [2, 4, 5]);
/// assert_eq!(c.shape(), [2, 4, 5]);
/// let names: Vec<String> = lstm.named_parameters().into_iter().map(|(n, _)| n).collect();
/// assert_eq!(names[..4], ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Lstm {
    inner: Recurrent,
}

impl Lstm {
    /// An LSTM from `input_size` features to `hidden_size`, with `opts`
    /// (layers, biases, batch-first, directions), its parameters drawn from
    /// `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size or layer count; out of
    /// memory.
    pub fn new(
        ctx: &ExecContext,
        input_size: usize,
        hidden_size: usize,
        opts: RnnOptions,
        seed: u64,
    ) -> Result<Lstm> {
        let inner = Recurrent::new(
            ctx,
            Cell::Lstm,
            "Lstm::new",
            input_size,
            hidden_size,
            opts,
            seed,
        )?;
        Ok(Lstm { inner })
    }

    /// Runs the LSTM over `x` (`[T, B, input]`, or `[B, T, input]` with
    /// `batch_first`) from the initial `state` `(h_0, c_0)` (`[layers *
    /// directions, B, hidden]` each; zeros when `None`). Returns the output
    /// (`[T, B, directions * hidden]`, or batch-first) and the final `(h_n,
    /// c_n)`.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] naming the layer for an input that is not
    /// 3-D with `input_size` features or a state of the wrong shape; the
    /// ops' errors.
    pub fn forward(
        &self,
        ctx: &ExecContext,
        x: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, (Tensor, Tensor))> {
        self.inner.check_input(x)?;
        let w = self.inner.weights();
        lstm(ctx, x, state, &w, self.inner.hidden, self.inner.opts)
    }
}

recurrent_common!(Lstm);

/// The output sequence alone, from zero initial states (as `nn.Sequential`
/// would use it with a module that returns only the output).
impl Forward for Lstm {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Ok(Lstm::forward(self, ctx, x, None)?.0)
    }
}

/// A multi-layer GRU, PyTorch's `nn.GRU(input_size, hidden_size, num_layers,
/// bias, batch_first, bidirectional=...)`: the parameters of [`Lstm`] with
/// `3 * hidden` rows (the gates `r, z, n`), each `U(-1/sqrt(hidden),
/// 1/sqrt(hidden))`. See [`gru`] for the computation. Not supported:
/// `dropout` between layers.
///
/// ```
/// use fucina::nn::{Gru, RnnOptions};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let opts = RnnOptions { bidirectional: true, ..Default::default() };
/// let gru = Gru::new(&ctx, 3, 4, opts, 1)?;
/// let (y, h) = gru.forward(&ctx, &Tensor::zeros(&ctx, &[6, 2, 3])?, None)?;
/// assert_eq!(y.shape(), [6, 2, 8]); // both directions side by side
/// assert_eq!(h.shape(), [2, 2, 4]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct Gru {
    inner: Recurrent,
}

impl Gru {
    /// A GRU from `input_size` features to `hidden_size`, with `opts`, its
    /// parameters drawn from `seed`.
    ///
    /// # Errors
    /// As [`Lstm::new`].
    pub fn new(
        ctx: &ExecContext,
        input_size: usize,
        hidden_size: usize,
        opts: RnnOptions,
        seed: u64,
    ) -> Result<Gru> {
        let inner = Recurrent::new(
            ctx,
            Cell::Gru,
            "Gru::new",
            input_size,
            hidden_size,
            opts,
            seed,
        )?;
        Ok(Gru { inner })
    }

    /// Runs the GRU over `x` from the initial state `h0` (`[layers *
    /// directions, B, hidden]`; zeros when `None`). Returns the output and
    /// the final `h_n`.
    ///
    /// # Errors
    /// As [`Lstm::forward`].
    pub fn forward(
        &self,
        ctx: &ExecContext,
        x: &Tensor,
        h0: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        self.inner.check_input(x)?;
        let w = self.inner.weights();
        gru(ctx, x, h0, &w, self.inner.hidden, self.inner.opts)
    }
}

recurrent_common!(Gru);

/// The output sequence alone, from a zero initial state.
impl Forward for Gru {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        Ok(Gru::forward(self, ctx, x, None)?.0)
    }
}

/// The parameters of a one-step cell in PyTorch's order (`weight_ih`,
/// `weight_hh`, then with biases `bias_ih`, `bias_hh`), each `U(-k, k)` with
/// `k = 1/sqrt(hidden)`, drawn from `sub_seed(seed, i)` for the `i`-th.
#[derive(Debug, Clone)]
struct CellParams {
    weight_ih: Parameter,
    weight_hh: Parameter,
    bias: Option<(Parameter, Parameter)>,
    input: usize,
    hidden: usize,
}

impl CellParams {
    #[allow(clippy::too_many_arguments)] // the layer's constructor arguments
    fn new(
        ctx: &ExecContext,
        what: &'static str,
        gates: usize,
        input: usize,
        hidden: usize,
        bias: bool,
        seed: u64,
    ) -> Result<CellParams> {
        check_size(what, "input_size", input)?;
        check_size(what, "hidden_size", hidden)?;
        let k = (1.0 / hidden as f64).sqrt() as f32;
        let draw = |shape: &[usize], i: u64| -> Result<Parameter> {
            Ok(Parameter::new(Tensor::uniform(
                ctx,
                shape,
                -k,
                k,
                sub_seed(seed, i),
            )?))
        };
        let rows = gates * hidden;
        Ok(CellParams {
            weight_ih: draw(&[rows, input], 0)?,
            weight_hh: draw(&[rows, hidden], 1)?,
            bias: if bias {
                Some((draw(&[rows], 2)?, draw(&[rows], 3)?))
            } else {
                None
            },
            input,
            hidden,
        })
    }

    fn named(&self) -> Vec<(String, Parameter)> {
        let mut v = vec![
            ("weight_ih".to_string(), self.weight_ih.clone()),
            ("weight_hh".to_string(), self.weight_hh.clone()),
        ];
        if let Some((bi, bh)) = &self.bias {
            v.push(("bias_ih".to_string(), bi.clone()));
            v.push(("bias_hh".to_string(), bh.clone()));
        }
        v
    }

    /// Checks `x` (`[B, input]`) and each present state (`[B, hidden]`);
    /// returns `B`.
    fn check(&self, layer: &str, x: &Tensor, states: &[Option<&Tensor>]) -> Result<usize> {
        let s = x.shape();
        if s.len() != 2 || s[1] != self.input {
            return Err(Error::ShapeMismatch {
                layer: layer.to_string(),
                got: s.to_vec(),
                reason: format!("the input must be [batch, {}]", self.input),
            });
        }
        for st in states.iter().flatten() {
            if st.shape() != [s[0], self.hidden] {
                return Err(Error::ShapeMismatch {
                    layer: layer.to_string(),
                    got: st.shape().to_vec(),
                    reason: format!(
                        "a state must be [batch, hidden] = [{}, {}]",
                        s[0], self.hidden
                    ),
                });
            }
        }
        Ok(s[0])
    }

    /// The gate pre-activations `(x W_ihᵀ + b_ih, h W_hhᵀ + b_hh)`.
    fn gates(&self, ctx: &ExecContext, x: &Tensor, h: &Tensor) -> Result<(Tensor, Tensor)> {
        let (bi, bh) = match &self.bias {
            Some((bi, bh)) => (Some(bi.tensor()), Some(bh.tensor())),
            None => (None, None),
        };
        let gi = x.linear(ctx, &self.weight_ih.tensor(), bi.as_ref())?;
        let gh = h.linear(ctx, &self.weight_hh.tensor(), bh.as_ref())?;
        Ok((gi, gh))
    }
}

/// The accessors and the `Module` impl that [`LstmCell`] and [`GruCell`]
/// share (both wrap a [`CellParams`]).
macro_rules! cell_common {
    ($t:ident) => {
        impl $t {
            /// The input features.
            pub fn input_size(&self) -> usize {
                self.p.input
            }

            /// The hidden state size (for the LSTM, also the cell state's).
            pub fn hidden_size(&self) -> usize {
                self.p.hidden
            }
        }

        impl Module for $t {
            fn named_parameters(&self) -> Vec<(String, Parameter)> {
                self.p.named()
            }
        }
    };
}

/// One LSTM step, PyTorch's `nn.LSTMCell(input_size, hidden_size, bias)`:
/// the parameters `weight_ih` (`[4 * hidden, input]`), `weight_hh` (`[4 *
/// hidden, hidden]`), `bias_ih` and `bias_hh` (`[4 * hidden]`), each
/// `U(-1/sqrt(hidden), 1/sqrt(hidden))`; the gates `x W_ihᵀ + b_ih` and `h
/// W_hhᵀ + b_hh` into the fused [`Tensor::lstm_cell`] (gates `i, f, g, o`).
/// Not supported: unbatched 1-D input.
///
/// ```
/// use fucina::nn::{LstmCell, Module};
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let cell = LstmCell::new(&ctx, 3, 5, true, 1)?;
/// let x = Tensor::zeros(&ctx, &[4, 3])?; // [batch, input]
/// let (h, c) = cell.forward(&ctx, &x, None)?; // zero initial state
/// let (h, c) = cell.forward(&ctx, &x, Some((&h, &c)))?;
/// assert_eq!(h.shape(), [4, 5]);
/// assert_eq!(c.shape(), [4, 5]);
/// assert_eq!(cell.named_parameters().len(), 4);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct LstmCell {
    p: CellParams,
}

impl LstmCell {
    /// A cell from `input_size` features to `hidden_size`, with the biases
    /// or not, its parameters drawn from `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size; out of memory.
    pub fn new(
        ctx: &ExecContext,
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        seed: u64,
    ) -> Result<LstmCell> {
        let p = CellParams::new(ctx, "LstmCell::new", 4, input_size, hidden_size, bias, seed)?;
        Ok(LstmCell { p })
    }

    /// One step from `x` (`[B, input]`) and the state `(h, c)` (`[B, hidden]`
    /// each; zeros when `None`): the next `(h', c')`.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] naming the layer for an input or a state of
    /// the wrong shape; the ops' errors.
    pub fn forward(
        &self,
        ctx: &ExecContext,
        x: &Tensor,
        state: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Tensor, Tensor)> {
        let (h, c) = state.unzip();
        let b = self.p.check("LstmCell", x, &[h, c])?;
        let (h, c) = match state {
            Some((h, c)) => (h.clone(), c.clone()),
            None => {
                let z = Tensor::zeros(ctx, &[b, self.p.hidden])?;
                (z.clone(), z)
            }
        };
        let (gi, gh) = self.p.gates(ctx, x, &h)?;
        Ok(gi.lstm_cell(ctx, &gh, &c)?)
    }
}

cell_common!(LstmCell);

/// One GRU step, PyTorch's `nn.GRUCell(input_size, hidden_size, bias)`: the
/// parameters of [`LstmCell`] with `3 * hidden` rows (gates `r, z, n`), each
/// `U(-1/sqrt(hidden), 1/sqrt(hidden))`; the gates into the fused
/// [`Tensor::gru_cell`]. Not supported: unbatched 1-D input.
///
/// ```
/// use fucina::nn::GruCell;
/// use fucina::{ExecContext, Tensor};
///
/// let ctx = ExecContext::new();
/// let cell = GruCell::new(&ctx, 3, 5, true, 1)?;
/// let x = Tensor::zeros(&ctx, &[4, 3])?;
/// let h = cell.forward(&ctx, &x, None)?;
/// assert_eq!(cell.forward(&ctx, &x, Some(&h))?.shape(), [4, 5]);
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct GruCell {
    p: CellParams,
}

impl GruCell {
    /// A cell from `input_size` features to `hidden_size`, with the biases
    /// or not, its parameters drawn from `seed`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero size; out of memory.
    pub fn new(
        ctx: &ExecContext,
        input_size: usize,
        hidden_size: usize,
        bias: bool,
        seed: u64,
    ) -> Result<GruCell> {
        let p = CellParams::new(ctx, "GruCell::new", 3, input_size, hidden_size, bias, seed)?;
        Ok(GruCell { p })
    }

    /// One step from `x` (`[B, input]`) and the state `h` (`[B, hidden]`;
    /// zeros when `None`): the next `h'`.
    ///
    /// # Errors
    /// As [`LstmCell::forward`].
    pub fn forward(&self, ctx: &ExecContext, x: &Tensor, h: Option<&Tensor>) -> Result<Tensor> {
        let b = self.p.check("GruCell", x, &[h])?;
        let h = match h {
            Some(h) => h.clone(),
            None => Tensor::zeros(ctx, &[b, self.p.hidden])?,
        };
        let (gi, gh) = self.p.gates(ctx, x, &h)?;
        Ok(gi.gru_cell(ctx, &gh, &h)?)
    }
}

cell_common!(GruCell);

/// The new state alone, from a zero state.
impl Forward for GruCell {
    fn forward(&self, ctx: &ExecContext, x: &Tensor) -> Result<Tensor> {
        GruCell::forward(self, ctx, x, None)
    }
}
