//! Keeping a secret out of what a call reports: the secret as it was read, and the forms an
//! API that echoes it back is likely to use: percent-encoded (either hex case, `+` or `%20`
//! for spaces), JSON-escaped, and base64 (standard and URL-safe, at any alignment inside a
//! longer base64 string, as in `Authorization: Basic`).

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use memchr::memmem;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) const REDACTED: &str = "[redacted]";
/// Shorter encoded fragments would match innocent text.
const MIN_FORM_CHARS: usize = 6;

/// Every form of `secret` to redact, longest first (so a longer form is never half-replaced
/// by a shorter one inside it).
pub(crate) fn forms(secret: &str) -> Vec<String> {
    let mut forms = vec![secret.to_owned()];
    let percent = utf8_percent_encode(secret, NON_ALPHANUMERIC).to_string();
    let lower_hex = lowercase_hex(&percent);
    forms.push(lower_hex.replace("%20", "+"));
    forms.push(lower_hex);
    forms.push(percent.replace("%20", "+"));
    forms.push(percent);
    // Only the characters an encoder must escape differ: `"`, `\` and controls, then `/`.
    let json = serde_json::to_string(secret).expect("a string serializes");
    let json = json[1..json.len() - 1].to_owned();
    forms.push(json.replace('/', "\\/"));
    forms.push(json);
    for engine in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        for offset in 0..3 {
            forms.push(base64_core(&engine, secret.as_bytes(), offset));
        }
    }
    forms.retain(|form| form == secret || form.len() >= MIN_FORM_CHARS);
    forms.sort_by_key(|form| std::cmp::Reverse(form.len()));
    forms.dedup();
    forms
}

/// `percent` with the hex digits of each `%XX` in lower case, and nothing else changed.
fn lowercase_hex(percent: &str) -> String {
    let mut out = String::with_capacity(percent.len());
    let mut hex_left: u8 = 0;
    for c in percent.chars() {
        out.push(if hex_left > 0 {
            c.to_ascii_lowercase()
        } else {
            c
        });
        hex_left = if c == '%' {
            2
        } else {
            hex_left.saturating_sub(1)
        };
    }
    out
}

/// The base64 characters that depend only on `secret` when it starts `offset` bytes into a
/// group of three: they appear in any encoding of a longer text that holds it there.
fn base64_core(engine: &impl Engine, secret: &[u8], offset: usize) -> String {
    let padded = [&vec![0u8; offset][..], secret].concat();
    let encoded = engine.encode(&padded);
    let first = if offset == 0 { 0 } else { 4 };
    let last = padded.len() / 3 * 4;
    encoded.get(first..last).unwrap_or_default().to_owned()
}

/// Forms of this many bytes in all, or fewer, are found in one pass (32 API tokens take a
/// tenth of it); an automaton for more (secrets of tens of KiB) takes long to build, and
/// they are searched form by form, each with a searcher built once.
const MAX_FINDER_BYTES: usize = 256 << 10;

/// Bytes one call's searches form by form may scan in all (each form's length of text, for
/// the forms no longer than it): past it, a text is withheld whole rather than searched for
/// seconds outside the call's deadline (some 350 forms of 32 long secrets in 16 MiB is 5.6 GB).
const MAX_SCAN_BYTES: usize = 1 << 30;

/// Every form of the secrets one call read, and what finds them: form by form, a text is
/// scanned once per form no longer than it (outside any guest's fuel, so within a budget
/// shared by all the call's texts); one pass scans it once.
#[derive(Clone)]
pub(crate) struct Redactor {
    /// Longest first.
    forms: Vec<String>,
    /// The secrets whose forms are in `forms`.
    secrets: std::collections::HashSet<String>,
    finder: Option<AhoCorasick>,
    /// One per form, in the same order, when there is no `finder`.
    finders: Vec<memchr::memmem::Finder<'static>>,
    /// Bytes still to scan form by form, for the whole call (its clones share it).
    scan_left: Arc<AtomicUsize>,
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor::with_scan_budget(MAX_SCAN_BYTES)
    }
}

impl Redactor {
    fn with_scan_budget(bytes: usize) -> Self {
        Redactor {
            forms: Vec::new(),
            secrets: Default::default(),
            finder: None,
            finders: Vec::new(),
            scan_left: Arc::new(AtomicUsize::new(bytes)),
        }
    }

    /// Adds `secret`'s forms; a secret added before adds nothing.
    pub(crate) fn add(&mut self, secret: &str) {
        if secret.is_empty() || !self.secrets.insert(secret.to_owned()) {
            return;
        }
        self.forms.extend(forms(secret));
        // Longest first across secrets too: one may hold another.
        self.forms.sort_by_key(|form| std::cmp::Reverse(form.len()));
        self.forms.dedup();
        let bytes: usize = self.forms.iter().map(String::len).sum();
        self.finder = (bytes <= MAX_FINDER_BYTES)
            .then(|| {
                // A DFA searches faster but takes seconds to build for long forms.
                AhoCorasick::builder()
                    .kind(Some(AhoCorasickKind::ContiguousNFA))
                    .match_kind(MatchKind::LeftmostLongest)
                    .build(&self.forms)
                    .ok()
            })
            .flatten();
        self.finders = match self.finder {
            Some(_) => Vec::new(),
            None => (self.forms.iter())
                .map(|form| memchr::memmem::Finder::new(form.as_bytes()).into_owned())
                .collect(),
        };
    }

    /// How many forms it looks for.
    #[cfg(test)]
    pub(crate) fn forms(&self) -> usize {
        self.forms.len()
    }

    /// `text` with every form of every secret replaced; withheld whole if searching it form
    /// by form would pass the call's scan budget.
    pub(crate) fn redact(&self, text: &str) -> String {
        if let Some(finder) = &self.finder {
            let mut clean = String::with_capacity(text.len());
            finder.replace_all_with(text, &mut clean, |_, _, clean| {
                clean.push_str(REDACTED);
                true
            });
            return clean;
        }
        let fits = |finder: &&memmem::Finder| finder.needle().len() <= text.len();
        let scan: usize = self.finders.iter().filter(fits).map(|_| text.len()).sum();
        let spent = (self.scan_left).fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
            left.checked_sub(scan)
        });
        if spent.is_err() {
            return format!(
                "[withheld: {} bytes is too much text to search for {} forms of secrets]",
                text.len(),
                self.forms.len()
            );
        }
        self.finders
            .iter()
            .filter(fits)
            .fold(text.to_owned(), |text, finder| replaced(finder, &text))
    }
}

/// `text` with each match of `finder` replaced by [`REDACTED`].
fn replaced(finder: &memmem::Finder, text: &str) -> String {
    let mut clean = String::with_capacity(text.len());
    let mut copied = 0;
    for at in finder.find_iter(text.as_bytes()) {
        clean.push_str(&text[copied..at]);
        clean.push_str(REDACTED);
        copied = at + finder.needle().len();
    }
    clean.push_str(&text[copied..]);
    clean
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t/Token+value \"x\"";

    fn clean(text: &str) -> String {
        let mut redactor = Redactor::default();
        redactor.add(SECRET);
        redactor.redact(text)
    }

    #[test]
    fn every_encoding_an_echo_uses_is_redacted() {
        let encoded = [
            SECRET.to_owned(),
            utf8_percent_encode(SECRET, NON_ALPHANUMERIC).to_string(),
            // Lower-case hex, as some encoders write it; the secret's own letters keep their case.
            "s3cr3t%2fToken%2bvalue%20%22x%22".to_owned(),
            url::form_urlencoded::byte_serialize(SECRET.as_bytes()).collect(),
            serde_json::to_string(SECRET).unwrap(),
            serde_json::to_string(SECRET).unwrap().replace('/', "\\/"),
        ];
        for form in encoded {
            let echoed = format!("{{\"echo\": \"before {form} after\"}}");
            let cleaned = clean(&echoed);
            assert!(cleaned.contains(REDACTED), "{form} -> {cleaned}");
            assert!(cleaned.starts_with("{\"echo\": \"before "), "{cleaned}");
        }
    }

    #[test]
    fn base64_is_caught_inside_longer_text_at_every_alignment() {
        for prefix in ["", "u", "us", "user:"] {
            let credentials = format!("{prefix}{SECRET}-and-more");
            for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
                let echoed = engine.encode(&credentials);
                let cleaned = clean(&format!("Basic {echoed}"));
                assert!(
                    cleaned.contains(REDACTED),
                    "{prefix:?}: {echoed} -> {cleaned}"
                );
            }
        }
    }

    /// Both ways of searching find the same: one pass for most sets of forms, form by form
    /// for sets too large for an automaton.
    #[test]
    fn a_secret_too_large_for_one_pass_is_redacted_form_by_form() {
        // Whole groups of three: its base64 has no partial group at the end.
        let large = "k".repeat(MAX_FINDER_BYTES / 2 / 3 * 3);
        let mut redactor = Redactor::default();
        redactor.add(SECRET);
        assert!(redactor.finder.is_some());
        redactor.add(&large);
        assert!(redactor.finder.is_none());
        let text = format!(
            "{SECRET} then {large} then {}",
            STANDARD_NO_PAD.encode(&large)
        );
        let cleaned = redactor.redact(&text);
        assert_eq!(cleaned, "[redacted] then [redacted] then [redacted]");
    }

    /// Form by form, a search costs the forms times the text: past a bound the text is
    /// withheld, never returned unsearched.
    #[test]
    fn too_much_text_to_search_form_by_form_is_withheld() {
        let large = "k".repeat(MAX_FINDER_BYTES);
        let mut redactor = Redactor::default();
        redactor.add(&large);
        assert!(redactor.finder.is_none());
        let text = format!("{large}x");
        // Each form no longer than the text scans it once (its base64 is longer).
        let fitting = redactor.forms.iter().filter(|f| f.len() <= text.len());
        let scanned = text.len() * fitting.count();
        let budgeted = |bytes| {
            let mut redactor = Redactor::with_scan_budget(bytes);
            redactor.add(&large);
            redactor
        };
        assert_eq!(budgeted(scanned).redact(&text), format!("{REDACTED}x"));
        let withheld = budgeted(scanned - 1).redact(&text);
        assert!(withheld.starts_with("[withheld: "), "{}", &withheld[..40]);
        assert!(!withheld.contains(&large));
        // The budget is the call's, not each text's: a second text finds it spent.
        let once = budgeted(scanned);
        assert_eq!(once.redact(&text), format!("{REDACTED}x"));
        assert!(once.clone().redact(&text).starts_with("[withheld: "));
    }

    /// A short text is not searched for forms longer than it: 32 secrets of 64 KB and
    /// thousands of short log lines once cost minutes of host CPU per call.
    #[test]
    fn a_short_text_costs_nothing_of_long_forms() {
        let mut redactor = Redactor::with_scan_budget(1);
        for n in 0..4 {
            redactor.add(&format!("{n}{}", "a/ \"Z".repeat(13_000)));
        }
        assert!(redactor.finder.is_none());
        for _ in 0..10_000 {
            assert_eq!(redactor.redact("a short line"), "a short line");
        }
        let left = redactor.scan_left.load(Ordering::Acquire);
        assert_eq!(left, 1, "nothing was scanned");
    }

    #[test]
    fn short_fragments_are_left_alone() {
        assert_eq!(forms("ab"), vec!["ab".to_owned()]);
        assert_eq!(clean("nothing secret here"), "nothing secret here");
    }
}
