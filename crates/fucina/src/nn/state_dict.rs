//! [`StateDict`]: ordered names -> tensors, plus string metadata.

use std::collections::BTreeMap;
use std::ops::Deref;

use fucina_autograd::Tensor;

use crate::error::{Error, Result};

/// The state of a model or an optimizer: named tensors in a fixed order, plus
/// string metadata (an epoch, a format version).
///
/// It is what [`Module::state_dict`](super::Module::state_dict) and
/// [`Optimizer::state_dict`](crate::optim::Optimizer::state_dict) return, what
/// their `load_state_dict` take, and what
/// [`checkpoint::save_module`](crate::checkpoint::save_module) writes. It
/// dereferences to the slice of its `(name, tensor)` entries, so it can be
/// passed wherever such a slice is taken and indexed like one. Names are
/// unique: [`insert`](StateDict::insert) refuses a repeated one.
///
/// The tensors are handles (no copy): a module's state dict shares the
/// parameters' storage, and the next in-place update of a parameter copies
/// rather than changes what the state dict holds.
///
/// ```
/// use fucina::nn::{Linear, Module, StateDict};
/// use fucina::ExecContext;
///
/// let ctx = ExecContext::new();
/// let fc = Linear::new(&ctx, 3, 2, 7)?;
/// let sd: StateDict = fc.state_dict();
/// assert_eq!(sd.names().collect::<Vec<_>>(), ["weight", "bias"]);
/// assert_eq!(sd.get("bias").unwrap().shape(), [2]);
/// let other = Linear::new(&ctx, 3, 2, 8)?;
/// other.load_state_dict(&sd)?;
/// assert_eq!(other.weight.to_vec(), fc.weight.to_vec());
/// # Ok::<(), fucina::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct StateDict {
    entries: Vec<(String, Tensor)>,
    metadata: BTreeMap<String, String>,
}

impl StateDict {
    /// An empty state dict.
    pub fn new() -> StateDict {
        StateDict::default()
    }

    /// Appends `name -> tensor`.
    ///
    /// # Errors
    /// [`Error::StateDict`] if `name` is empty or already present (nothing is
    /// added).
    pub fn insert(&mut self, name: impl Into<String>, tensor: Tensor) -> Result<()> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::state("an entry name must not be empty"));
        }
        if self.get(&name).is_some() {
            return Err(Error::state(format!("duplicate entry \"{name}\"")));
        }
        self.entries.push((name, tensor));
        Ok(())
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.entries.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    /// The tensor named `name`, to replace it (the names stay unique).
    pub fn get_mut(&mut self, name: &str) -> Option<&mut Tensor> {
        self.entries
            .iter_mut()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// The names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    /// The metadata (sorted by key).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Sets metadata entry `key` to `value` (replacing an earlier value).
    pub fn set_metadata(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.metadata.insert(key.into(), value.into());
    }

    /// The entries whose name starts with `prefix`, with the prefix removed
    /// (the metadata is kept): the model part of a checkpoint holding
    /// `"model.*"` and `"optim.*"` entries, for example.
    pub fn strip_prefix(&self, prefix: &str) -> StateDict {
        StateDict {
            entries: self
                .entries
                .iter()
                .filter_map(|(n, t)| n.strip_prefix(prefix).map(|n| (n.to_string(), t.clone())))
                .collect(),
            metadata: self.metadata.clone(),
        }
    }

    /// Every name with `prefix` put in front (the metadata is kept).
    pub fn with_prefix(&self, prefix: &str) -> StateDict {
        StateDict {
            entries: self
                .entries
                .iter()
                .map(|(n, t)| (format!("{prefix}{n}"), t.clone()))
                .collect(),
            metadata: self.metadata.clone(),
        }
    }

    /// Appends every entry of `other` (and its metadata).
    ///
    /// # Errors
    /// [`Error::StateDict`] if a name of `other` is already present (nothing is
    /// added).
    pub fn extend(&mut self, other: StateDict) -> Result<()> {
        if let Some((n, _)) = other.entries.iter().find(|(n, _)| self.get(n).is_some()) {
            return Err(Error::state(format!("duplicate entry \"{n}\"")));
        }
        for (i, (n, _)) in other.entries.iter().enumerate() {
            if other.entries[..i].iter().any(|(m, _)| m == n) {
                return Err(Error::state(format!("duplicate entry \"{n}\"")));
            }
        }
        self.entries.extend(other.entries);
        self.metadata.extend(other.metadata);
        Ok(())
    }

    /// The entries.
    pub fn into_entries(self) -> Vec<(String, Tensor)> {
        self.entries
    }

    /// Builds a state dict from entries.
    ///
    /// # Errors
    /// [`Error::StateDict`] for an empty or repeated name.
    pub fn from_entries(entries: Vec<(String, Tensor)>) -> Result<StateDict> {
        let mut sd = StateDict::new();
        sd.entries.reserve(entries.len());
        for (n, t) in entries {
            sd.insert(n, t)?;
        }
        Ok(sd)
    }

    /// The entries from code that produced unique names (an internal shortcut).
    pub(crate) fn from_unique(entries: Vec<(String, Tensor)>) -> StateDict {
        StateDict {
            entries,
            metadata: BTreeMap::new(),
        }
    }
}

impl Deref for StateDict {
    type Target = [(String, Tensor)];
    fn deref(&self) -> &[(String, Tensor)] {
        &self.entries
    }
}

impl IntoIterator for StateDict {
    type Item = (String, Tensor);
    type IntoIter = std::vec::IntoIter<(String, Tensor)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.into_iter()
    }
}

impl<'a> IntoIterator for &'a StateDict {
    type Item = &'a (String, Tensor);
    type IntoIter = std::slice::Iter<'a, (String, Tensor)>;
    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}
