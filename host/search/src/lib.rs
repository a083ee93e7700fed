//! Tool search for agents facing large catalogs: a hybrid index (BM25 over tool texts blended
//! with static word-piece embeddings), or, with a model configured, all-MiniLM-L6-v2 run here
//! in int8 (`encoder`). It reads [`ToolSpec`](toolhost_spec::ToolSpec)s and nothing else: no
//! host, no Wasm, no store (vectors persist through the [`VectorCache`] trait). Built with
//! `opt-level = 3` in every profile, so its tests run at release speed.

#![deny(missing_docs)]

pub mod embed;
pub mod encoder;
pub mod index;

pub use encoder::SentenceEncoder;
pub use index::{Index, ToolVectors, VectorCache, tokens};

/// Little-endian f32s, as the model files and the cached vectors keep them; a trailing
/// partial value is ignored (callers check the length).
pub fn f32s_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}
