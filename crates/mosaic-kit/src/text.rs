//! Quoting users' text in messages without echoing all of it: an error about a module name of
//! a million characters quotes its first few dozen, not a megabyte.

use std::borrow::Cow;

/// The most characters of a name or other user string that an error message quotes.
pub const QUOTED_CHARS: usize = 80;

/// `s` as a message quotes it: whole when it has at most `max_chars` characters, else its
/// first `max_chars` followed by `…` and its length.
pub fn clip(s: &str, max_chars: usize) -> Cow<'_, str> {
    match s.char_indices().nth(max_chars) {
        None => Cow::Borrowed(s),
        Some((end, _)) => Cow::Owned(format!(
            "{}… ({} characters in all)",
            &s[..end],
            s.chars().count()
        )),
    }
}

/// A name as a message quotes it: [`clip`] to [`QUOTED_CHARS`].
pub fn name(s: &str) -> Cow<'_, str> {
    clip(s, QUOTED_CHARS)
}

/// `s` whole when it has at most `max_chars` characters, else its beginning and its end (a
/// third of `max_chars`) around `…` and the number of characters left out: for a whole
/// message, whose end (`at line 1 column 9`, `expected …`) matters as much as its beginning.
pub fn clip_middle(s: &str, max_chars: usize) -> Cow<'_, str> {
    let total = s.chars().count();
    if total <= max_chars {
        return Cow::Borrowed(s);
    }
    let tail = max_chars / 3;
    let head = max_chars - tail;
    let head_end = s.char_indices().nth(head).map_or(s.len(), |(i, _)| i);
    let tail_start = s
        .char_indices()
        .nth(total - tail)
        .map_or(s.len(), |(i, _)| i);
    Cow::Owned(format!(
        "{} … ({} characters left out) … {}",
        &s[..head_end],
        total - head - tail,
        &s[tail_start..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_and_long_text_is_clipped_at_a_character() {
        assert_eq!(clip("vision", 80), "vision");
        assert_eq!(name(&"x".repeat(80)), "x".repeat(80));
        let long = "é".repeat(1_000_000);
        let clipped = name(&long);
        assert!(clipped.starts_with(&"é".repeat(80)));
        assert!(
            clipped.ends_with("… (1000000 characters in all)"),
            "{clipped}"
        );
        assert!(clipped.chars().count() < 120);
    }

    #[test]
    fn the_middle_of_a_long_message_is_left_out() {
        assert_eq!(clip_middle("short", 10), "short");
        let message = format!("invalid type: string \"{}\", at line 1", "y".repeat(5000));
        let clipped = clip_middle(&message, 300);
        assert!(
            clipped.starts_with("invalid type: string \"yyy"),
            "{clipped}"
        );
        assert!(clipped.ends_with("yy\", at line 1"), "{clipped}");
        assert!(clipped.contains("characters left out"));
        assert!(clipped.chars().count() < 360, "{}", clipped.chars().count());
        // Multi-byte characters at the cut do not split.
        assert!(clip_middle(&"ü".repeat(100), 10).starts_with("üüüüüüü …"));
    }
}
