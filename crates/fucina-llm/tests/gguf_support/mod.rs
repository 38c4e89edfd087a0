//! Writes GGUF images field by field (the tests' own writer, independent of the
//! reader under test).

#![allow(dead_code)]

/// Hugging Face's and llama.cpp's names of a Llama model's whole-model tensors.
pub(crate) const LLAMA_MODEL_NAMES: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// Hugging Face's and llama.cpp's names of a Llama layer's tensors, after
/// `model.layers.N.` and `blk.N.`.
pub(crate) const LLAMA_LAYER_NAMES: [(&str, &str); 9] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// The name of a Llama tensor translated by the tables above, from the side
/// `from` (0: Hugging Face, 1: llama.cpp) to the other; panics on a name they
/// do not hold.
fn llama_name(name: &str, from: usize) -> String {
    let side = |p: &(&'static str, &'static str)| if from == 0 { (p.0, p.1) } else { (p.1, p.0) };
    if let Some((_, to)) = LLAMA_MODEL_NAMES.iter().map(side).find(|(f, _)| *f == name) {
        return to.to_string();
    }
    let (prefix, to_prefix) = [("model.layers.", "blk."), ("blk.", "model.layers.")][from];
    let (layer, tail) = name
        .strip_prefix(prefix)
        .and_then(|rest| rest.split_once('.'))
        .unwrap_or_else(|| panic!("unmapped tensor {name}"));
    let to = LLAMA_LAYER_NAMES
        .iter()
        .map(side)
        .find(|(f, _)| *f == tail)
        .unwrap_or_else(|| panic!("unmapped tensor {name}"))
        .1;
    format!("{to_prefix}{layer}.{to}")
}

/// llama.cpp's name of the Hugging Face Llama tensor `hf`.
pub(crate) fn llama_gguf_name(hf: &str) -> String {
    llama_name(hf, 0)
}

/// Hugging Face's name of the llama.cpp Llama tensor `gguf`.
pub(crate) fn llama_hf_name(gguf: &str) -> String {
    llama_name(gguf, 1)
}

/// llama.cpp's row order for the q or k projection: its row `h·D + 2j + i` is
/// Hugging Face's row `h·D + i·D/2 + j`.
pub(crate) fn permute(bytes: &[u8], rows: usize, row_bytes: usize, head_dim: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes.len()];
    for h in 0..rows / head_dim {
        for i in 0..2 {
            for j in 0..head_dim / 2 {
                let from = h * head_dim + i * head_dim / 2 + j;
                let to = h * head_dim + 2 * j + i;
                out[to * row_bytes..(to + 1) * row_bytes]
                    .copy_from_slice(&bytes[from * row_bytes..(from + 1) * row_bytes]);
            }
        }
    }
    out
}

/// Builds GGUF images field by field.
#[derive(Default)]
pub(crate) struct Writer {
    meta: Vec<u8>,
    n_meta: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

pub(crate) fn string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A u32 metadata value's bytes.
pub(crate) fn u32v(v: usize) -> Vec<u8> {
    (v as u32).to_le_bytes().to_vec()
}

/// An f32 metadata value's bytes.
pub(crate) fn f32v(v: f32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// A string metadata value's bytes.
pub(crate) fn str_v(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    string(&mut out, s);
    out
}

impl Writer {
    pub(crate) fn kv(&mut self, key: &str, ty: u32, value: &[u8]) -> &mut Self {
        string(&mut self.meta, key);
        self.meta.extend_from_slice(&ty.to_le_bytes());
        self.meta.extend_from_slice(value);
        self.n_meta += 1;
        self
    }

    /// A tensor with `dims` (innermost first) of ggml type `code` and `bytes` of data,
    /// placed at the next 32-byte boundary of the data section.
    pub(crate) fn tensor(
        &mut self,
        name: &str,
        dims: &[u64],
        code: u32,
        bytes: &[u8],
    ) -> &mut Self {
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        string(&mut self.infos, name);
        self.infos
            .extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend_from_slice(&d.to_le_bytes());
        }
        self.infos.extend_from_slice(&code.to_le_bytes());
        self.infos
            .extend_from_slice(&(self.data.len() as u64).to_le_bytes());
        self.data.extend_from_slice(bytes);
        self.n_tensors += 1;
        self
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&self.n_tensors.to_le_bytes());
        out.extend_from_slice(&self.n_meta.to_le_bytes());
        out.extend_from_slice(&self.meta);
        out.extend_from_slice(&self.infos);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend_from_slice(&self.data);
        out
    }
}
