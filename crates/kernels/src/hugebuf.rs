//! Large zeroed buffers in their own anonymous mapping, advised for transparent huge pages on
//! Linux: the repacked weights and the CPU KV cache. Both are streamed by decode, and with
//! 4 KiB pages every 4 KiB costs a TLB miss (and the KV cache's blocks, scattered over the pool,
//! are 2 KiB runs per head: a miss for nearly every run). Linux's default THP mode is
//! `madvise`, where only advised memory gets 2 MiB pages; the `Vec`s of the heap are not.
//!
//! The advice is a hint: a kernel without THP, or one set to `never`, keeps 4 KiB pages and
//! nothing else changes. Pages are still faulted in lazily, so an untouched region costs no
//! memory (in 2 MiB steps where huge pages back it).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use crate::quantdot::KernelError;

/// Element types a [`HugeBuf`] may hold: plain numbers, for which all-zero bytes are a valid
/// value and every bit pattern is too (sealed: only the types below).
pub trait Elem: Copy + Send + Sync + sealed::Sealed + 'static {}

mod sealed {
    pub trait Sealed {}
}

macro_rules! elems {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Elem for $t {}
    )*};
}
elems!(u8, i8, u16, f32);

/// `len` zeroed `T`s in an anonymous mapping advised for huge pages; derefs to `[T]`.
pub struct HugeBuf<T: Elem> {
    map: memmap2::MmapMut,
    len: usize,
    _elem: PhantomData<T>,
}

impl<T: Elem> HugeBuf<T> {
    /// `len` zeroed elements (a clear error when the mapping fails, e.g. out of address space).
    pub fn zeroed(len: usize) -> Result<HugeBuf<T>, KernelError> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or(KernelError::Map {
            bytes: usize::MAX,
            why: format!("{len} elements overflow the address space"),
        })?;
        let map = memmap2::MmapMut::map_anon(bytes.max(1)).map_err(|e| KernelError::Map {
            bytes,
            why: e.to_string(),
        })?;
        #[cfg(target_os = "linux")]
        {
            // Only a hint (see the module docs).
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        Ok(HugeBuf {
            map,
            len,
            _elem: PhantomData,
        })
    }
}

impl<T: Elem> Deref for HugeBuf<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the mapping is page-aligned (so aligned for T), holds at least
        // `len · size_of::<T>()` initialized (zeroed, then only written through `&mut [T]`)
        // bytes, lives as long as `self`, and any bit pattern is a valid `T` (`Elem`).
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Elem> DerefMut for HugeBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Elem> std::fmt::Debug for HugeBuf<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HugeBuf<{}>[{}]", std::any::type_name::<T>(), self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_writable_and_sized_on_awkward_lengths() {
        for len in [0usize, 1, 3, 7, 33, 1023, (2 << 20) / 2 + 1] {
            let mut b = HugeBuf::<u16>::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0));
            b.iter_mut().enumerate().for_each(|(i, x)| *x = i as u16);
            assert!(b.iter().enumerate().all(|(i, &x)| x == i as u16));
        }
        let f = HugeBuf::<f32>::zeroed(5).unwrap();
        assert_eq!(&f[..], &[0.0; 5]);
        assert_eq!(
            format!("{:?}", HugeBuf::<i8>::zeroed(2).unwrap()),
            "HugeBuf<i8>[2]"
        );
    }

    #[test]
    fn an_impossible_size_is_an_error() {
        let e = HugeBuf::<f32>::zeroed(usize::MAX / 2).unwrap_err();
        assert!(matches!(e, KernelError::Map { .. }), "{e}");
    }
}
