//! NVRTC without a GPU: `loom-emit`'s CUDA C to PTX for a virtual architecture (`compute_80`, ...).
//!
//! NVRTC is a compiler library; it needs no driver (`libcuda`) and no device. It is opened here with
//! `libloading` from an explicit place rather than through cudarc's `nvrtc` module, because cudarc only tries
//! bare library names (found through the dynamic linker's path, fixed when the process starts) and panics when
//! a library or symbol is missing. [`Nvrtc::get`] looks, in order, at:
//!
//! 1. `$LOOM_NVRTC`: the library file, or a folder holding `libnvrtc.so.12` (or `libnvrtc.so`);
//! 2. the dynamic linker's path: `libnvrtc.so.12`, then `libnvrtc.so`;
//! 3. `/usr/local/cuda/lib64/libnvrtc.so.12` and `libnvrtc.so` there.
//!
//! `libnvrtc` finds its `libnvrtc-builtins.so.12.X` next to itself (its RUNPATH is `$ORIGIN`).
//! The device path (`compile` in this crate) and the device-free test (`tests/nvrtc.rs`, which compiles every
//! motif kernel and assembles the PTX with `ptxas`) both go through [`Nvrtc::compile_ptx`].

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

type Program = *mut c_void;
type Status = c_int;

type VersionFn = unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status;
type ErrorStringFn = unsafe extern "C" fn(Status) -> *const c_char;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> Status;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> Status;
type TextFn = unsafe extern "C" fn(Program, *mut c_char) -> Status;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> Status;

/// An opened NVRTC library (`libnvrtc.so`) and the functions this crate calls.
pub struct Nvrtc {
    path: PathBuf,
    version: (i32, i32),
    error_string: ErrorStringFn,
    create: CreateFn,
    compile: CompileFn,
    ptx_size: SizeFn,
    ptx: TextFn,
    log_size: SizeFn,
    log: TextFn,
    destroy: DestroyFn,
    // Last: the function pointers above point into it.
    _lib: libloading::Library,
}

impl fmt::Debug for Nvrtc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvrtc")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// PTX from [`Nvrtc::compile_ptx`], with NVRTC's log (warnings; usually empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ptx {
    /// The PTX text (no trailing NUL).
    pub text: String,
    /// NVRTC's program log of a successful compilation.
    pub log: String,
}

/// Why a source did not compile: NVRTC's status and its program log (the compiler's diagnostics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileError {
    /// The program's name (shown in the log's `file(line): error` lines).
    pub name: String,
    /// The options NVRTC was given.
    pub options: Vec<String>,
    /// NVRTC's status text, e.g. `NVRTC_ERROR_COMPILATION`.
    pub status: String,
    /// The program log.
    pub log: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NVRTC did not compile `{}` ({}; options {}):\n{}",
            self.name,
            self.status,
            self.options.join(" "),
            self.log.trim_end()
        )
    }
}

impl std::error::Error for CompileError {}

/// The library names tried, in order, when `$LOOM_NVRTC` is not set.
const CANDIDATES: &[&str] = &[
    "libnvrtc.so.12",
    "libnvrtc.so",
    "/usr/local/cuda/lib64/libnvrtc.so.12",
    "/usr/local/cuda/lib64/libnvrtc.so",
];

impl Nvrtc {
    /// The process-wide NVRTC (opened once, never closed): `$LOOM_NVRTC`, else the usual names (see the module
    /// doc). The error says what was tried.
    pub fn get() -> Result<&'static Nvrtc, String> {
        static NVRTC: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
        NVRTC
            .get_or_init(|| match std::env::var_os("LOOM_NVRTC") {
                Some(p) if !p.is_empty() => Nvrtc::open(Path::new(&p)),
                _ => Nvrtc::open_default(),
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Whether [`Nvrtc::get`] finds a library (opening it if it had not been).
    pub fn is_present() -> bool {
        Nvrtc::get().is_ok()
    }

    fn open_default() -> Result<Nvrtc, String> {
        let mut errors = Vec::new();
        for c in CANDIDATES {
            match Nvrtc::open_file(Path::new(c)) {
                Ok(n) => return Ok(n),
                Err(e) => errors.push(e),
            }
        }
        Err(format!(
            "NVRTC (libnvrtc.so) could not be opened (set LOOM_NVRTC to the library or its folder): {}",
            errors.join("; ")
        ))
    }

    /// Opens NVRTC from `path`: the library file, or a folder holding `libnvrtc.so.12` or `libnvrtc.so`.
    pub fn open(path: &Path) -> Result<Nvrtc, String> {
        if path.is_dir() {
            let twelve = path.join("libnvrtc.so.12");
            let file = if twelve.exists() {
                twelve
            } else {
                path.join("libnvrtc.so")
            };
            return Nvrtc::open_file(&file);
        }
        Nvrtc::open_file(path)
    }

    fn open_file(path: &Path) -> Result<Nvrtc, String> {
        let shown = path.display();
        // SAFETY: loading runs the library's initialisers; libnvrtc's only set up its own state.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| format!("{shown}: {e}"))?;
        fn sym<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
            // SAFETY: every `T` this is called with is the C signature of that NVRTC function in nvrtc.h
            // (CUDA 11 and 12): an `nvrtcResult` (a C enum, `int`) returned, `nvrtcProgram` an opaque
            // pointer, sizes `size_t`. The pointer is used only while `lib` is kept open (in `Nvrtc`).
            unsafe { lib.get::<T>(name.as_bytes()) }
                .map(|s| *s)
                .map_err(|e| format!("{name}: {e}"))
        }
        let version: VersionFn =
            sym(&lib, "nvrtcVersion").map_err(|e| format!("{shown} is not NVRTC: {e}"))?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: `nvrtcVersion` writes two ints.
        if unsafe { version(&mut major, &mut minor) } != 0 {
            return Err(format!("{shown}: nvrtcVersion failed"));
        }
        let f = |e: String| format!("{shown}: {e}");
        Ok(Nvrtc {
            path: path.to_path_buf(),
            version: (major, minor),
            error_string: sym(&lib, "nvrtcGetErrorString").map_err(f)?,
            create: sym(&lib, "nvrtcCreateProgram").map_err(f)?,
            compile: sym(&lib, "nvrtcCompileProgram").map_err(f)?,
            ptx_size: sym(&lib, "nvrtcGetPTXSize").map_err(f)?,
            ptx: sym(&lib, "nvrtcGetPTX").map_err(f)?,
            log_size: sym(&lib, "nvrtcGetProgramLogSize").map_err(f)?,
            log: sym(&lib, "nvrtcGetProgramLog").map_err(f)?,
            destroy: sym(&lib, "nvrtcDestroyProgram").map_err(f)?,
            _lib: lib,
        })
    }

    /// The library file this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// NVRTC's (major, minor) version, e.g. (12, 8).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    fn status(&self, s: Status) -> String {
        // SAFETY: `nvrtcGetErrorString` returns a static NUL-terminated string for any value.
        let p = unsafe { (self.error_string)(s) };
        if p.is_null() {
            return format!("NVRTC status {s}");
        }
        // SAFETY: non-null, NUL-terminated and static (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    /// Compiles CUDA C `source` to PTX for the virtual architecture `arch` (`compute_80`, `compute_90`, ...;
    /// NVRTC's `--gpu-architecture`). `name` names the program in NVRTC's diagnostics (`kernel.cu`).
    pub fn compile_ptx(&self, source: &str, name: &str, arch: &str) -> Result<Ptx, CompileError> {
        let options = vec![format!("--gpu-architecture={arch}")];
        let fail = |status: String, log: String| CompileError {
            name: name.to_string(),
            options: options.clone(),
            status,
            log,
        };
        let nul = |what: &str| {
            fail(
                "invalid input".into(),
                format!("{what} contains a NUL byte"),
            )
        };
        let c_source = CString::new(source).map_err(|_| nul("the source"))?;
        let c_name = CString::new(name).map_err(|_| nul("the name"))?;
        let c_options: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| nul("an option"))?;
        let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();

        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: the strings are NUL-terminated and outlive the call; no headers (0, null, null).
        let s = unsafe {
            (self.create)(
                &mut prog,
                c_source.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if s != 0 || prog.is_null() {
            return Err(fail(self.status(s), String::new()));
        }
        let prog = Prog { nvrtc: self, prog };
        // SAFETY: `prog` is a live program; the option pointers are valid for the call.
        let s =
            unsafe { (self.compile)(prog.prog, option_ptrs.len() as c_int, option_ptrs.as_ptr()) };
        let log = prog.text(self.log_size, self.log).unwrap_or_default();
        if s != 0 {
            return Err(fail(self.status(s), log));
        }
        let text = prog
            .text(self.ptx_size, self.ptx)
            .map_err(|s| fail(self.status(s), log.clone()))?;
        Ok(Ptx { text, log })
    }
}

/// A live `nvrtcProgram`, destroyed on drop.
struct Prog<'a> {
    nvrtc: &'a Nvrtc,
    prog: Program,
}

impl Prog<'_> {
    /// A size-then-text pair (the log, the PTX) as a string without its trailing NUL.
    fn text(&self, size: SizeFn, get: TextFn) -> Result<String, Status> {
        let mut n = 0usize;
        // SAFETY: `prog` is live; the function writes one `size_t`.
        let s = unsafe { size(self.prog, &mut n) };
        if s != 0 {
            return Err(s);
        }
        let mut buf = vec![0u8; n.max(1)];
        // SAFETY: the buffer has the `n` bytes (NUL included) NVRTC said it writes.
        let s = unsafe { get(self.prog, buf.as_mut_ptr().cast()) };
        if s != 0 {
            return Err(s);
        }
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        buf.truncate(end);
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }
}

impl Drop for Prog<'_> {
    fn drop(&mut self) {
        // SAFETY: `prog` was created by this library and is destroyed once.
        unsafe { (self.nvrtc.destroy)(&mut self.prog) };
    }
}
