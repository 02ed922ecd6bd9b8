//! The Porter stemmer as Lucene's `PorterStemFilter` (and so Anserini) applies it: Martin Porter's reference
//! implementation of the 1980 algorithm, with its published departures (`bli` -> `ble`, `logi` -> `log`),
//! not the Snowball "Porter2" English stemmer that tantivy ships.

/// Stems one lower-cased token. Words of one or two characters are left alone, as in the reference.
pub fn stem(word: &str) -> String {
    let mut s = Stemmer { b: word.chars().collect(), k: 0, j: 0 };
    if s.b.len() <= 2 {
        return word.to_string();
    }
    s.k = s.b.len() - 1;
    s.step1ab();
    if s.k > 0 {
        s.step1c();
        s.step2();
        s.step3();
        s.step4();
        s.step5();
    }
    s.b[..=s.k].iter().collect()
}

/// `b[0..=k]` is the word being stemmed; `j` is the length of the stem before the suffix matched by the
/// last `ends` (the reference's `j + 1`, so that it never goes negative).
struct Stemmer {
    b: Vec<char>,
    k: usize,
    j: usize,
}

impl Stemmer {
    fn cons(&self, i: usize) -> bool {
        match self.b[i] {
            'a' | 'e' | 'i' | 'o' | 'u' => false,
            'y' => i == 0 || !self.cons(i - 1),
            _ => true,
        }
    }

    /// The number of consonant-vowel sequences in `b[0..j]` (the stem before the matched suffix).
    fn m(&self) -> usize {
        let stem_len = self.stem_len();
        let mut n = 0;
        let mut i = 0;
        loop {
            if i >= stem_len {
                return n;
            }
            if !self.cons(i) {
                break;
            }
            i += 1;
        }
        i += 1;
        loop {
            loop {
                if i >= stem_len {
                    return n;
                }
                if self.cons(i) {
                    break;
                }
                i += 1;
            }
            i += 1;
            n += 1;
            loop {
                if i >= stem_len {
                    return n;
                }
                if !self.cons(i) {
                    break;
                }
                i += 1;
            }
            i += 1;
        }
    }

    /// Length of the stem `b[0..=j]` (the reference's j + 1).
    fn stem_len(&self) -> usize {
        self.j
    }

    fn vowel_in_stem(&self) -> bool {
        (0..self.stem_len()).any(|i| !self.cons(i))
    }

    fn double_c(&self, j: usize) -> bool {
        j >= 1 && self.b[j] == self.b[j - 1] && self.cons(j)
    }

    /// consonant-vowel-consonant ending at i, the last consonant not w, x or y.
    fn cvc(&self, i: usize) -> bool {
        if i < 2 || !self.cons(i) || self.cons(i - 1) || !self.cons(i - 2) {
            return false;
        }
        !matches!(self.b[i], 'w' | 'x' | 'y')
    }

    /// Does `b[0..=k]` end with `s`? Sets the stem length `j` to what precedes it.
    fn ends(&mut self, s: &str) -> bool {
        let l = s.chars().count();
        if l > self.k + 1 {
            return false;
        }
        let start = self.k + 1 - l;
        if !self.b[start..=self.k].iter().copied().eq(s.chars()) {
            return false;
        }
        self.j = start;
        true
    }

    /// Replaces the matched suffix with `s`.
    fn set_to(&mut self, s: &str) {
        self.b.truncate(self.j);
        self.b.extend(s.chars());
        // k may become "before the start" only for an empty result, which the callers never produce
        // (every replacement is non-empty or the stem is non-empty).
        self.k = self.b.len().saturating_sub(1);
    }

    fn r(&mut self, s: &str) {
        if self.m() > 0 {
            self.set_to(s);
        }
    }

    /// Plurals and -ed / -ing.
    fn step1ab(&mut self) {
        if self.b[self.k] == 's' {
            if self.ends("sses") {
                self.k -= 2;
            } else if self.ends("ies") {
                self.set_to("i");
            } else if self.b[self.k - 1] != 's' {
                self.k -= 1;
            }
            self.b.truncate(self.k + 1);
        }
        if self.ends("eed") {
            if self.m() > 0 {
                self.k -= 1;
                self.b.truncate(self.k + 1);
            }
        } else if (self.ends("ed") || self.ends("ing")) && self.vowel_in_stem() {
            self.b.truncate(self.j);
            self.k = self.j - 1;
            if self.ends("at") {
                self.set_to("ate");
            } else if self.ends("bl") {
                self.set_to("ble");
            } else if self.ends("iz") {
                self.set_to("ize");
            } else if self.double_c(self.k) {
                if !matches!(self.b[self.k - 1], 'l' | 's' | 'z') {
                    self.k -= 1;
                    self.b.truncate(self.k + 1);
                }
            } else {
                self.j = self.k + 1;
                if self.m() == 1 && self.cvc(self.k) {
                    self.set_to("e");
                }
            }
        }
    }

    /// Terminal y to i when there is another vowel in the stem.
    fn step1c(&mut self) {
        if self.ends("y") && self.vowel_in_stem() {
            self.b[self.k] = 'i';
        }
    }

    /// Double suffixes to single ones (-ization -> -ize ...), when m > 0.
    fn step2(&mut self) {
        const RULES: &[(&str, &str)] = &[
            ("ational", "ate"),
            ("tional", "tion"),
            ("enci", "ence"),
            ("anci", "ance"),
            ("izer", "ize"),
            ("bli", "ble"),
            ("alli", "al"),
            ("entli", "ent"),
            ("eli", "e"),
            ("ousli", "ous"),
            ("ization", "ize"),
            ("ation", "ate"),
            ("ator", "ate"),
            ("alism", "al"),
            ("iveness", "ive"),
            ("fulness", "ful"),
            ("ousness", "ous"),
            ("aliti", "al"),
            ("iviti", "ive"),
            ("biliti", "ble"),
            ("logi", "log"),
        ];
        self.first_rule(RULES, 1);
    }

    /// -ic-, -full, -ness etc., when m > 0.
    fn step3(&mut self) {
        const RULES: &[(&str, &str)] = &[
            ("icate", "ic"),
            ("ative", ""),
            ("alize", "al"),
            ("iciti", "ic"),
            ("ical", "ic"),
            ("ful", ""),
            ("ness", ""),
        ];
        self.first_rule(RULES, 0);
    }

    /// Applies the first rule whose suffix matches (the reference dispatches on the penultimate or last
    /// letter, then tries the suffixes of that group in order; a match ends the step even when m = 0).
    fn first_rule(&mut self, rules: &[(&str, &str)], letter_from_end: usize) {
        if self.k < letter_from_end {
            return;
        }
        let key = self.b[self.k - letter_from_end];
        for (suffix, replacement) in rules {
            let suffix_key = suffix.chars().rev().nth(letter_from_end);
            if suffix_key == Some(key) && self.ends(suffix) {
                self.r(replacement);
                return;
            }
        }
    }

    /// Strips -ant, -ence etc. in context <c>vcvc<v>, when m > 1.
    fn step4(&mut self) {
        const SUFFIXES: &[&str] = &[
            "al", "ance", "ence", "er", "ic", "able", "ible", "ant", "ement", "ment", "ent", "ion", "ou", "ism", "ate",
            "iti", "ous", "ive", "ize",
        ];
        if self.k < 1 {
            return;
        }
        let key = self.b[self.k - 1];
        let mut matched = false;
        for suffix in SUFFIXES {
            if suffix.chars().rev().nth(1) != Some(key) || !self.ends(suffix) {
                continue;
            }
            if *suffix == "ion" && !(self.j >= 1 && matches!(self.b[self.j - 1], 's' | 't')) {
                // -ion only after s or t; the reference then tries -ou, which cannot match a word ending in n.
                return;
            }
            matched = true;
            break;
        }
        if matched && self.m() > 1 {
            self.k = self.j - 1;
            self.b.truncate(self.j);
        }
    }

    /// Removes a final -e when m > 1 (or m = 1 and not *o), and -ll to -l when m > 1.
    fn step5(&mut self) {
        // The reference moves k without shortening the word and keeps j at the old end, so the -ll check
        // still measures m() over the word with its -e.
        self.j = self.k + 1;
        let mut k = self.k;
        if self.b[k] == 'e' {
            let a = self.m();
            if a > 1 || (a == 1 && !self.cvc(k - 1)) {
                k -= 1;
            }
        }
        if self.b[k] == 'l' && self.double_c(k) && self.m() > 1 {
            k -= 1;
        }
        self.k = k;
        self.b.truncate(k + 1);
    }
}

#[cfg(test)]
mod tests {
    use super::stem;

    /// Pairs from Martin Porter's published vocabulary / output lists, covering every step, plus the
    /// reference implementation's departures that Lucene keeps.
    #[test]
    fn reference_vocabulary() {
        let cases = [
            ("caresses", "caress"),
            ("ponies", "poni"),
            ("ties", "ti"),
            ("caress", "caress"),
            ("cats", "cat"),
            ("feed", "feed"),
            ("agreed", "agre"),
            ("plastered", "plaster"),
            ("bled", "bled"),
            ("motoring", "motor"),
            ("sing", "sing"),
            ("conflated", "conflat"),
            ("troubled", "troubl"),
            ("sized", "size"),
            ("hopping", "hop"),
            ("tanned", "tan"),
            ("falling", "fall"),
            ("hissing", "hiss"),
            ("fizzed", "fizz"),
            ("failing", "fail"),
            ("filing", "file"),
            ("happy", "happi"),
            ("sky", "sky"),
            ("relational", "relat"),
            ("conditional", "condit"),
            ("rational", "ration"),
            ("valenci", "valenc"),
            ("hesitanci", "hesit"),
            ("digitizer", "digit"),
            ("conformabli", "conform"),
            ("radicalli", "radic"),
            ("differentli", "differ"),
            ("vileli", "vile"),
            ("analogousli", "analog"),
            ("vietnamization", "vietnam"),
            ("predication", "predic"),
            ("operator", "oper"),
            ("feudalism", "feudal"),
            ("decisiveness", "decis"),
            ("hopefulness", "hope"),
            ("callousness", "callous"),
            ("formaliti", "formal"),
            ("sensitiviti", "sensit"),
            ("sensibiliti", "sensibl"),
            ("triplicate", "triplic"),
            ("formative", "form"),
            ("formalize", "formal"),
            ("electriciti", "electr"),
            ("electrical", "electr"),
            ("hopeful", "hope"),
            ("goodness", "good"),
            ("revival", "reviv"),
            ("allowance", "allow"),
            ("inference", "infer"),
            ("airliner", "airlin"),
            ("gyroscopic", "gyroscop"),
            ("adjustable", "adjust"),
            ("defensible", "defens"),
            ("irritant", "irrit"),
            ("replacement", "replac"),
            ("adjustment", "adjust"),
            ("dependent", "depend"),
            ("adoption", "adopt"),
            ("homologou", "homolog"),
            ("communism", "commun"),
            ("activate", "activ"),
            ("angulariti", "angular"),
            ("homologous", "homolog"),
            ("effective", "effect"),
            ("bowdlerize", "bowdler"),
            ("probate", "probat"),
            ("rate", "rate"),
            ("cease", "ceas"),
            ("controll", "control"),
            ("roll", "roll"),
            ("generalizations", "gener"),
            ("oscillators", "oscil"),
            ("aerodynamics", "aerodynam"),
            ("slipstream", "slipstream"),
            ("experimental", "experiment"),
            ("investigation", "investig"),
            ("archaeology", "archaeolog"),
            ("possibly", "possibl"),
            ("is", "is"),
            ("as", "as"),
            ("news", "new"),
            ("ies", "i"),
            ("eed", "eed"),
            ("ying", "ying"),
        ];
        for (word, expected) in cases {
            assert_eq!(stem(word), expected, "stem({word})");
        }
    }

    /// Every distinct word of the shared collections (55,016) against Martin Porter's reference implementation
    /// (as NLTK's `MARTIN_EXTENSIONS` mode runs it; `scripts/porter-vocabulary.py` writes the fixture).
    #[test]
    fn every_word_of_the_shared_collections_stems_as_the_reference_does() {
        use std::io::Read;
        let packed = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/porter-vocabulary.tsv.gz"));
        let mut text = String::new();
        flate2::read::GzDecoder::new(&packed[..]).read_to_string(&mut text).unwrap();
        let mut checked = 0;
        for line in text.lines() {
            let (word, expected) = line.split_once('\t').unwrap();
            assert_eq!(stem(word), expected, "stem({word})");
            checked += 1;
        }
        assert_eq!(checked, 55_016);
    }
}
