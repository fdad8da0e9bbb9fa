//! A function of arrays that MLX traces once per input signature (shapes and dtypes) and replays
//! after (`mlx::core::compile`): a replay skips the host's work of building the graph, and MLX
//! fuses runs of elementwise operations into one kernel.
//!
//! What the function reads from the host while it is traced is baked into the trace: a value
//! that changes from call to call (a position, a length, a sampling key) must come in as an input
//! array, or the replay computes with the value of the trace. Host-side effects inside the
//! function (a counter bumped, a cache entry replaced) happen only when it is traced.

use crate::engine::ops::{arrays_of, ArrayList};
use mlx_rs::{error::Exception, Array};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Whether `a` is a tracer of a function MLX is compiling: its value is the trace's, and keeping it
/// past the trace (in a cache, say) would hand a later call an array that holds no data.
pub fn is_traced(a: &Array) -> bool {
    // SAFETY: a live array.
    unsafe { mlx_sys::mlx_sys_array_is_tracer(a.as_ptr()) == 1 }
}

/// One compiled function: its traces live in MLX's compile cache under this value's id until it
/// is dropped.
pub struct Compiled {
    id: usize,
}

type Body<'a> = dyn FnMut(&[Array]) -> Result<Vec<Array>, Exception> + 'a;

/// What the C trampoline reaches: the Rust function and the error it returned, if any.
struct Payload<'f, 'a> {
    body: &'f mut Body<'a>,
    error: Option<Exception>,
}

impl Default for Compiled {
    fn default() -> Self {
        Self::new()
    }
}

impl Compiled {
    pub fn new() -> Self {
        // MLX keys its compile cache by an id per function; ids of dropped values are not reused.
        static NEXT: AtomicUsize = AtomicUsize::new(1);
        Self { id: NEXT.fetch_add(1, Ordering::Relaxed) }
    }

    /// `body(inputs)`, traced on the first call with these inputs' shapes and dtypes and replayed
    /// on later ones (`body` is then not run). `body` must be the same function at every call:
    /// the one given on a replay is ignored.
    pub fn call(&self, inputs: &[&Array], mut body: impl FnMut(&[Array]) -> Result<Vec<Array>, Exception>) -> Result<Vec<Array>, Exception> {
        let mut payload = Payload { body: &mut body, error: None };
        let inputs = ArrayList::of(inputs);
        let mut outputs = ArrayList::empty();
        // SAFETY: the closure and the compiled closure are freed before `payload` goes out of
        // scope, and MLX calls the closure only within `mlx_closure_apply` (on a trace); the
        // payload has no destructor of its own, since it lives on this stack frame.
        let status = unsafe {
            let closure = mlx_sys::mlx_closure_new_func_payload(Some(trampoline), (&mut payload as *mut Payload).cast(), None);
            let mut compiled = mlx_sys::mlx_closure_new();
            let mut status = mlx_sys::mlx_detail_compile(&mut compiled, closure, self.id, false, std::ptr::null(), 0);
            if status == 0 {
                status = mlx_sys::mlx_closure_apply(outputs.as_mut_ptr(), compiled, inputs.as_ptr());
            }
            mlx_sys::mlx_closure_free(compiled);
            mlx_sys::mlx_closure_free(closure);
            status
        };
        match (status, payload.error) {
            (_, Some(error)) => Err(error),
            (0, None) => Ok(outputs.into_arrays()),
            _ => Err(Exception::custom("MLX could not compile or run the function")),
        }
    }
}

impl Drop for Compiled {
    fn drop(&mut self) {
        // SAFETY: a fresh handle to MLX's (global) compile cache, freed after the erase.
        unsafe {
            let mut cache = mlx_sys::mlx_compile_cache_new();
            if mlx_sys::mlx_detail_compile_cache(&mut cache) == 0 {
                mlx_sys::mlx_detail_compile_erase(cache, self.id);
            }
            mlx_sys::mlx_compile_cache_free(cache);
        }
    }
}

/// Called by MLX when it traces: runs the Rust function on the tracer arrays and hands back its
/// outputs; an error (or a panic) is kept for [`Compiled::call`] to return.
unsafe extern "C" fn trampoline(res: *mut mlx_sys::mlx_vector_array, input: mlx_sys::mlx_vector_array, payload: *mut std::ffi::c_void) -> std::os::raw::c_int {
    // SAFETY: `payload` is the `Payload` that `Compiled::call` lent for the duration of the call.
    let payload = unsafe { &mut *(payload as *mut Payload) };
    // SAFETY: MLX's vector of the tracer inputs, live for the call.
    let inputs = unsafe { arrays_of(input) };
    let body = &mut payload.body;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&inputs))) {
        Ok(Ok(outputs)) => {
            let handles: Vec<mlx_sys::mlx_array> = outputs.iter().map(|a| a.as_ptr()).collect();
            // SAFETY: `res` is the (unset) vector MLX passed; it takes its own references.
            unsafe { mlx_sys::mlx_vector_array_set_data(res, handles.as_ptr(), handles.len()) }
        }
        Ok(Err(error)) => {
            payload.error = Some(error);
            1
        }
        Err(panic) => {
            let what = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            payload.error = Some(Exception::custom(format!("the compiled function panicked: {}", what.unwrap_or_default())));
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ops::to_vec_f32;

    #[test]
    fn a_replay_computes_with_new_inputs_and_skips_the_body() {
        let compiled = Compiled::new();
        let mut traced = 0;
        let mut f = |x: &Array, y: &Array| {
            compiled
                .call(&[x, y], |a| {
                    traced += 1;
                    Ok(vec![a[0].multiply(&a[1])?.add(&a[0])?])
                })
                .unwrap()
                .remove(0)
        };
        let (x, y) = (Array::from_slice(&[1.0f32, 2.0], &[2]), Array::from_slice(&[3.0f32, 4.0], &[2]));
        assert_eq!(to_vec_f32(&f(&x, &y)).unwrap(), vec![4.0, 10.0]);
        let (x, y) = (Array::from_slice(&[-1.0f32, 0.5], &[2]), Array::from_slice(&[2.0f32, 2.0], &[2]));
        assert_eq!(to_vec_f32(&f(&x, &y)).unwrap(), vec![-3.0, 1.5]);
        // A new shape is a new trace.
        let (x, y) = (Array::from_slice(&[1.0f32, 1.0, 1.0], &[3]), Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]));
        assert_eq!(to_vec_f32(&f(&x, &y)).unwrap(), vec![2.0, 3.0, 4.0]);
        assert_eq!(traced, 2, "traced once per input shape");
    }

    #[test]
    fn arrays_are_tracers_inside_the_trace_only() {
        let compiled = Compiled::new();
        let x = Array::from_slice(&[1.0f32, 2.0], &[2]);
        let mut seen = Vec::new();
        let mut run = |x: &Array| {
            compiled
                .call(&[x], |a| {
                    let y = a[0].multiply(&a[0])?;
                    seen.push((is_traced(&a[0]), is_traced(&y), is_traced(&Array::from_f32(1.0))));
                    Ok(vec![y])
                })
                .unwrap()
                .remove(0)
        };
        let out = run(&x);
        assert_eq!(to_vec_f32(&out).unwrap(), vec![1.0, 4.0]);
        // The input and what is made from it are tracers; a constant made inside is not.
        assert_eq!(seen, vec![(true, true, false)]);
        assert!(!is_traced(&x) && !is_traced(&out));
    }

    #[test]
    fn a_host_value_read_at_the_trace_is_baked_in() {
        // Why positions and lengths must be inputs: the replay keeps the trace's constant.
        let compiled = Compiled::new();
        let run = |x: &Array, host: f32| compiled.call(&[x], |a| Ok(vec![a[0].add(Array::from_f32(host))?])).unwrap().remove(0);
        let x = Array::from_slice(&[1.0f32], &[1]);
        assert_eq!(to_vec_f32(&run(&x, 10.0)).unwrap(), vec![11.0]);
        assert_eq!(to_vec_f32(&run(&x, 20.0)).unwrap(), vec![11.0]);
    }

    #[test]
    fn errors_and_panics_in_the_body_come_back_as_errors() {
        let compiled = Compiled::new();
        let x = Array::from_slice(&[1.0f32], &[1]);
        let e = compiled.call(&[&x], |_| Err(Exception::custom("no such layer"))).expect_err("an error");
        assert!(e.to_string().contains("no such layer"), "{e}");
        let other = Compiled::new();
        let e = other.call(&[&x], |_| panic!("index out of range")).expect_err("an error");
        assert!(e.to_string().contains("index out of range"), "{e}");
        // A failed trace is not cached: the next call traces again.
        let out = compiled.call(&[&x], |a| Ok(vec![a[0].add(&a[0])?])).unwrap();
        assert_eq!(to_vec_f32(&out[0]).unwrap(), vec![2.0]);
    }
}
