//! A vector file's records read in place: the bytes of the records it holds, mapped read-only and seen as
//! `f32`, so that scoring a candidate's segments costs no system call and no copy.

use std::fs::File;

// The files are little-endian (`model::VectorFile`); their bytes are read as this machine's `f32`.
const _: () = assert!(cfg!(target_endian = "little"), "vector files are read in place on little-endian machines");

pub struct MappedVectors {
    map: memmap2::Mmap,
    dims: usize,
}

impl MappedVectors {
    /// Maps the first `records` records of `file` (`dims` floats each), which it holds; none for no record.
    pub fn new(file: &File, dims: usize, records: u64) -> std::io::Result<Option<MappedVectors>> {
        let len = records as usize * dims * 4;
        if len == 0 {
            return Ok(None);
        }
        // SAFETY: read-only, and over bytes that never change while mapped: a vector file's records are written
        // once, before their keys, and `records` counts only records whose keys were read; appends go past them,
        // and a replica's pull writes another file rather than this one.
        let map = unsafe { memmap2::MmapOptions::new().len(len).map(file)? };
        assert!(map.as_ptr().align_offset(std::mem::align_of::<f32>()) == 0, "a mapping starts on a page");
        Ok(Some(MappedVectors { map, dims }))
    }

    /// Record `record`'s vector (below the `records` mapped).
    pub fn record(&self, record: u64) -> &[f32] {
        let start = record as usize * self.dims * 4;
        let bytes = &self.map[start..start + self.dims * 4];
        // SAFETY: `bytes` is in bounds (sliced above), 4-byte aligned (the mapping is page-aligned and every
        // offset a multiple of 4), and any 4 bytes are a valid `f32`; it lives as long as `self`.
        unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<f32>(), self.dims) }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    #[test]
    fn records_read_in_place_are_the_files_floats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.f32");
        let floats: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 1.0).collect();
        let mut file = File::create(&path).unwrap();
        file.write_all(&floats.iter().flat_map(|f| f.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        let mapped = MappedVectors::new(&File::open(&path).unwrap(), 3, 4).unwrap().unwrap();
        for r in 0..4 {
            assert_eq!(mapped.record(r), &floats[r as usize * 3..r as usize * 3 + 3]);
        }
        assert!(MappedVectors::new(&File::open(&path).unwrap(), 3, 0).unwrap().is_none());
    }
}
