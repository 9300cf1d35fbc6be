//! Allocation-class scoping: a guard that sets the backend's class for the ops issued while it
//! lives and puts the previous one back when dropped, so an early `?` return cannot leave the
//! backend allocating in the wrong class.

use zcompute::{AllocClass, Backend, Element};

/// Sets the allocation class of later outputs until dropped.
pub(crate) struct ClassGuard<'b, B: Backend<T>, T: Element> {
    backend: &'b B,
    previous: AllocClass,
    _elem: std::marker::PhantomData<T>,
}

impl<'b, B: Backend<T>, T: Element> ClassGuard<'b, B, T> {
    pub(crate) fn new(backend: &'b B, class: AllocClass) -> Self {
        let previous = backend.set_alloc_class(class);
        ClassGuard {
            backend,
            previous,
            _elem: std::marker::PhantomData,
        }
    }
}

impl<B: Backend<T>, T: Element> Drop for ClassGuard<'_, B, T> {
    fn drop(&mut self) {
        self.backend.set_alloc_class(self.previous);
    }
}
