//! Parameter groups: parameters that share a weight decay (for example no
//! decay on biases and norm gains).

use fucina_autograd::Tensor;
use fucina_exec::RawTensor;
use fucina_storage::Buffer;

use crate::error::{Error, Result};
use crate::nn::Parameter;

/// Parameters that share hyperparameters inside one optimizer: today the
/// weight decay (`None`: the optimizer configuration's). Pass a list of groups
/// to [`AdamW::with_groups`](super::AdamW::with_groups),
/// [`Adam::with_groups`](super::Adam::with_groups) or
/// [`Sgd::with_groups`](super::Sgd::with_groups); [`decay_groups`] builds the
/// usual split.
///
/// The optimizer's parameter `i` (the index of its state entries) counts
/// through the groups in order. Its state holds the grouping
/// (`"param_groups"`: the group of each parameter) and each group's weight
/// decay (`"group_weight_decay"`), so a checkpoint restores both, and a state
/// grouped differently is refused.
#[derive(Clone, Debug)]
pub struct ParamGroup {
    /// The parameters.
    pub params: Vec<Parameter>,
    /// The weight decay of this group (`None`: the configuration's).
    pub weight_decay: Option<f32>,
}

impl ParamGroup {
    /// A group with the configuration's hyperparameters.
    pub fn new(params: Vec<Parameter>) -> ParamGroup {
        ParamGroup {
            params,
            weight_decay: None,
        }
    }

    /// This group with weight decay `wd`.
    pub fn with_weight_decay(mut self, wd: f32) -> ParamGroup {
        self.weight_decay = Some(wd);
        self
    }
}

/// The usual split for weight decay: a group of the matrices and higher-rank
/// weights (rank >= 2: the configuration's decay) and a group of the vectors
/// (rank 1: biases, norm gains; no decay), each in the order given.
///
/// ```
/// use fucina::nn::{Linear, Module};
/// use fucina::optim::{AdamW, decay_groups};
/// use fucina::ExecContext;
///
/// let ctx = ExecContext::new();
/// let fc = Linear::new(&ctx, 4, 2, 1)?;
/// let groups = decay_groups(fc.parameters());
/// assert_eq!(groups[0].params.len(), 1); // the weight
/// assert_eq!(groups[1].weight_decay, Some(0.0)); // the bias
/// let opt = AdamW::with_groups(groups, 1e-3)?;
/// # let _ = opt;
/// # Ok::<(), fucina::Error>(())
/// ```
pub fn decay_groups(params: Vec<Parameter>) -> Vec<ParamGroup> {
    let (matrices, vectors): (Vec<_>, Vec<_>) = params
        .into_iter()
        .partition(|p| p.shape().as_slice().len() >= 2);
    vec![
        ParamGroup::new(matrices),
        ParamGroup::new(vectors).with_weight_decay(0.0),
    ]
}

/// The state entry naming each parameter's group.
pub(crate) const GROUPS_ENTRY: &str = "param_groups";
/// The state entry holding each group's weight decay.
pub(crate) const DECAY_ENTRY: &str = "group_weight_decay";

/// The grouping of an optimizer built with groups.
#[derive(Clone, Debug)]
pub(crate) struct Groups {
    /// The group of each parameter.
    pub(crate) of: Vec<usize>,
    /// The weight decay of each group.
    pub(crate) wd: Vec<f32>,
}

impl Groups {
    /// Flattens `groups` (checking every weight decay; `default_wd` for
    /// `None`).
    pub(crate) fn build(
        what: &'static str,
        groups: Vec<ParamGroup>,
        default_wd: f32,
    ) -> Result<(Vec<Parameter>, Groups)> {
        let mut params = Vec::new();
        let mut g = Groups {
            of: Vec::new(),
            wd: Vec::with_capacity(groups.len()),
        };
        for (k, group) in groups.into_iter().enumerate() {
            let wd = group.weight_decay.unwrap_or(default_wd);
            if !(wd.is_finite() && wd >= 0.0) {
                return Err(Error::invalid(
                    what,
                    format!("group {k}: weight_decay must be finite and >= 0 (got {wd})"),
                ));
            }
            g.wd.push(wd);
            g.of.extend(std::iter::repeat_n(k, group.params.len()));
            params.extend(group.params);
        }
        Ok((params, g))
    }

    /// The weight decay of parameter `i`.
    pub(crate) fn wd_of(&self, i: usize) -> f32 {
        self.wd[self.of[i]]
    }

    /// The state entries of the grouping (none without parameters).
    pub(crate) fn entries(&self) -> Vec<(String, Tensor)> {
        if self.of.is_empty() || self.wd.is_empty() {
            return Vec::new();
        }
        let of: Vec<f32> = self.of.iter().map(|&k| k as f32).collect();
        let t = |v: Vec<f32>| {
            let n = v.len();
            let raw = RawTensor::from_buffer(Buffer::from_vec(v), &[n])
                .expect("a non-empty vector fits its own length");
            Tensor::constant(raw)
        };
        vec![
            (GROUPS_ENTRY.to_string(), t(of)),
            (DECAY_ENTRY.to_string(), t(self.wd.clone())),
        ]
    }
}

/// The entries other than the grouping, and the weight decays to restore.
pub(crate) type Split = (Vec<(String, Tensor)>, Option<Vec<f32>>);

/// Splits the grouping entries off `state` and checks them against `groups`
/// (the optimizer's grouping, if built with groups): returns the other entries
/// and the weight decays to restore. A grouped optimizer needs them in any
/// non-empty state; an ungrouped one refuses them.
pub(crate) fn split_state(groups: Option<&Groups>, state: &[(String, Tensor)]) -> Result<Split> {
    let mut rest = Vec::with_capacity(state.len());
    let (mut of, mut wd) = (None, None);
    for (name, t) in state {
        let slot = match name.as_str() {
            GROUPS_ENTRY => &mut of,
            DECAY_ENTRY => &mut wd,
            _ => {
                rest.push((name.clone(), t.clone()));
                continue;
            }
        };
        if slot.replace(t).is_some() {
            return Err(Error::state(format!("duplicate entry \"{name}\"")));
        }
    }
    let Some(g) = groups else {
        if let Some(name) = [(GROUPS_ENTRY, of), (DECAY_ENTRY, wd)]
            .into_iter()
            .find_map(|(n, t)| t.map(|_| n))
        {
            return Err(Error::state(format!(
                "unexpected entry \"{name}\" (the state has parameter groups; build the optimizer with with_groups)"
            )));
        }
        return Ok((rest, None));
    };
    if state.is_empty() || g.entries().is_empty() {
        return Ok((rest, None));
    }
    let (Some(of), Some(wd)) = (of, wd) else {
        let name = if of.is_none() {
            GROUPS_ENTRY
        } else {
            DECAY_ENTRY
        };
        return Err(Error::state(format!(
            "missing entry \"{name}\" (this optimizer has parameter groups)"
        )));
    };
    let want: Vec<f32> = g.of.iter().map(|&k| k as f32).collect();
    if of.shape() != [want.len()] || of.to_vec() != want {
        return Err(Error::state(format!(
            "\"{GROUPS_ENTRY}\" = {:?} does not match this optimizer's groups {:?}",
            of.to_vec(),
            want
        )));
    }
    if wd.shape() != [g.wd.len()] {
        return Err(Error::state(format!(
            "\"{DECAY_ENTRY}\" has shape {:?}, but there are {} groups",
            wd.shape(),
            g.wd.len()
        )));
    }
    let values = wd.to_vec();
    if let Some(v) = values.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
        return Err(Error::state(format!(
            "\"{DECAY_ENTRY}\" holds {v}; a weight decay must be finite and >= 0"
        )));
    }
    Ok((rest, Some(values)))
}
