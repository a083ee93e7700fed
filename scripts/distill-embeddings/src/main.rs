//! Embeds every word piece of the MiniLM bundled in `pocket-encoder` on its own (the model2vec
//! recipe): one 384-float row per token id, little-endian, to `table.f32`; and the vocabulary,
//! one token a line by id, to `vocab.txt`. `quantize.py` turns them into the host's table.
use std::io::Write;

fn main() {
    let tokenizer = std::env::args()
        .nth(1)
        .expect("usage: distill-embeddings PATH/TO/pocket-encoder/assets/tokenizer.json");
    let tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tokenizer).unwrap()).unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object().unwrap();
    let mut by_id = vec![String::new(); vocab.len()];
    for (token, id) in vocab {
        by_id[id.as_u64().unwrap() as usize] = token.clone();
    }
    std::fs::write("vocab.txt", by_id.join("\n") + "\n").unwrap();
    let encoder = pocket_encoder::Encoder::new().unwrap();
    let mut table = std::io::BufWriter::new(std::fs::File::create("table.f32").unwrap());
    for chunk in by_id.chunks(256) {
        // A continuation piece is embedded as the text it stands for.
        let texts: Vec<&str> = chunk.iter().map(|t| t.trim_start_matches("##")).collect();
        for row in encoder.embed(&texts).unwrap() {
            for x in row {
                table.write_all(&x.to_le_bytes()).unwrap();
            }
        }
    }
}
