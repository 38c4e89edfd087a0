//! LoRA adapters: `y = base(x) + (alpha / r) · B · A · dropout(x)`, with `A`
//! (`[r, in]`) drawn as PEFT draws it by default (`init_lora_weights=True`:
//! Kaiming-uniform with `a = sqrt(5)`, U[-1/sqrt(in), 1/sqrt(in))) and `B`
//! (`[out, r]`) zero, so a fresh adapter leaves the model unchanged.

use fucina::nn::Parameter;
use fucina::{ExecContext, Tensor};

use super::error::{FinetuneError, invalid};

/// A projection of a decoder layer that an adapter can target (PEFT's
/// `target_modules` names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// `self_attn.q_proj`.
    QProj,
    /// `self_attn.k_proj`.
    KProj,
    /// `self_attn.v_proj`.
    VProj,
    /// `self_attn.o_proj`.
    OProj,
    /// `mlp.gate_proj`.
    GateProj,
    /// `mlp.up_proj`.
    UpProj,
    /// `mlp.down_proj`.
    DownProj,
}

impl Target {
    /// Every target, in the order of a layer's forward.
    pub const ALL: [Target; 7] = [
        Target::QProj,
        Target::KProj,
        Target::VProj,
        Target::OProj,
        Target::GateProj,
        Target::UpProj,
        Target::DownProj,
    ];

    /// PEFT's name (`q_proj`).
    pub fn name(self) -> &'static str {
        match self {
            Target::QProj => "q_proj",
            Target::KProj => "k_proj",
            Target::VProj => "v_proj",
            Target::OProj => "o_proj",
            Target::GateProj => "gate_proj",
            Target::UpProj => "up_proj",
            Target::DownProj => "down_proj",
        }
    }

    /// The module path within a layer (`self_attn.q_proj`).
    pub fn module(self) -> &'static str {
        match self {
            Target::QProj => "self_attn.q_proj",
            Target::KProj => "self_attn.k_proj",
            Target::VProj => "self_attn.v_proj",
            Target::OProj => "self_attn.o_proj",
            Target::GateProj => "mlp.gate_proj",
            Target::UpProj => "mlp.up_proj",
            Target::DownProj => "mlp.down_proj",
        }
    }

    /// The target named `name` (`q_proj`), if any.
    pub fn from_name(name: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The targets of a comma-separated list (`q_proj,v_proj`), sorted and
    /// without repeats; `all` names the seven.
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] naming an unknown or empty entry.
    pub fn parse_list(list: &str) -> Result<Vec<Target>, FinetuneError> {
        if list.trim() == "all" {
            return Ok(Target::ALL.to_vec());
        }
        let mut out = Vec::new();
        for name in list.split(',').map(str::trim) {
            let t = Target::from_name(name).ok_or_else(|| {
                invalid(
                    "Target::parse_list",
                    format!(
                        "unknown target `{name}` (known: {}, or `all`)",
                        Target::ALL.map(Target::name).join(", ")
                    ),
                )
            })?;
            out.push(t);
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

/// The shape of the adapters of a job (PEFT's `LoraConfig`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoraConfig {
    /// The rank `r`.
    pub r: usize,
    /// `alpha`: the adapter's output is scaled by `alpha / r`.
    pub alpha: f32,
    /// Dropout probability on the adapter's input (training only).
    pub dropout: f32,
    /// The projections that get an adapter, in every layer.
    pub targets: Vec<Target>,
    /// The seed of the `A` matrices' draw (adapter `k` of the model, counted
    /// layer by layer in [`Target::ALL`] order, draws from a seed derived
    /// from this one and `k`).
    pub seed: u64,
}

impl Default for LoraConfig {
    /// PEFT's defaults (`r = 8`, `lora_alpha = 8`, no dropout) on `q_proj`
    /// and `v_proj`, seed 0.
    fn default() -> LoraConfig {
        LoraConfig {
            r: 8,
            alpha: 8.0,
            dropout: 0.0,
            targets: vec![Target::QProj, Target::VProj],
            seed: 0,
        }
    }
}

impl LoraConfig {
    /// `alpha / r`.
    pub fn scaling(&self) -> f32 {
        self.alpha / self.r as f32
    }

    /// Checks the values.
    ///
    /// # Errors
    /// [`FinetuneError::Invalid`] for `r = 0`, a non-finite `alpha`, a dropout
    /// outside `[0, 1)` or no target.
    pub fn check(&self) -> Result<(), FinetuneError> {
        const OP: &str = "LoraConfig::check";
        if self.r == 0 {
            return Err(invalid(OP, "the rank r is 0"));
        }
        if !self.alpha.is_finite() {
            return Err(invalid(OP, format!("alpha {} is not finite", self.alpha)));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(invalid(
                OP,
                format!("dropout {} is not in [0, 1)", self.dropout),
            ));
        }
        if self.targets.is_empty() {
            return Err(invalid(OP, "no target projection"));
        }
        Ok(())
    }
}

/// The seed of the `k`-th adapter's `A` draw (splitmix64 of the job's seed
/// and `k`).
pub(crate) fn adapter_seed(seed: u64, k: u64) -> u64 {
    fucina::rng::at(seed, k)
}

/// One adapter: `A` (`[r, in]`), `B` (`[out, r]`) and the scaling.
#[derive(Clone, Debug)]
pub struct LoraAdapter {
    /// `lora_A.weight`.
    pub a: Parameter,
    /// `lora_B.weight`.
    pub b: Parameter,
    /// `alpha / r`.
    pub scaling: f32,
    /// Dropout probability on the input.
    pub dropout: f32,
}

impl LoraAdapter {
    /// A fresh adapter of a `[out, in]` projection: `A` Kaiming-uniform from
    /// `seed`, `B` zero.
    ///
    /// # Errors
    /// Out of memory.
    pub fn new(
        ctx: &ExecContext,
        cfg: &LoraConfig,
        out: usize,
        inp: usize,
        seed: u64,
    ) -> Result<LoraAdapter, FinetuneError> {
        let a = Tensor::kaiming_uniform(ctx, &[cfg.r, inp], seed)?;
        let b = Tensor::zeros(ctx, &[out, cfg.r])?;
        Ok(LoraAdapter {
            a: Parameter::new(a),
            b: Parameter::new(b),
            scaling: cfg.scaling(),
            dropout: cfg.dropout,
        })
    }

    /// `scaling · B · A · dropout(x)` for the rows of `x` (`[n, in]`);
    /// `dropout_seed` is `None` outside training (no dropout).
    ///
    /// # Errors
    /// Shape errors; out of memory.
    pub fn forward(
        &self,
        ctx: &ExecContext,
        x: &Tensor,
        dropout_seed: Option<u64>,
    ) -> Result<Tensor, FinetuneError> {
        let x = match dropout_seed {
            Some(seed) if self.dropout > 0.0 => x.dropout(ctx, self.dropout, seed)?,
            _ => x.clone(),
        };
        let h = x.linear(ctx, &self.a.tensor(), None)?;
        Ok(h.linear(ctx, &self.b.tensor(), None)?
            .scale(ctx, self.scaling)?)
    }
}
