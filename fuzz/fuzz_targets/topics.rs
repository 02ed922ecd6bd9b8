#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| longrank_fuzz::topics(data));
