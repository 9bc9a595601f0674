#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| tern::fuzzing::mp4(data));
