//! Writes GGUF images field by field (the tests' own writer, independent of the
//! reader under test).

#![allow(dead_code)]

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
