//! A small builder for hand-written IR programs (the compiler is not ready yet).
#![allow(dead_code, unreachable_pub)]

use loom_ir::*;
use loom_vm::*;
use std::sync::Arc;

pub fn v(x: ValueId) -> Operand {
    Operand::Value(x)
}
pub fn i64_(x: i64) -> Operand {
    Operand::Imm(Imm::I64(x))
}
pub fn i32_(x: i32) -> Operand {
    Operand::Imm(Imm::I32(x))
}
pub fn f64_(x: f64) -> Operand {
    Operand::Imm(Imm::F64(x))
}
pub fn f32_(x: f32) -> Operand {
    Operand::Imm(Imm::F32(x))
}
pub fn b_(x: bool) -> Operand {
    Operand::Imm(Imm::I1(x))
}
pub fn s_(x: &str) -> Operand {
    Operand::Imm(Imm::Str(x.to_string()))
}
pub fn list(t: Type) -> Type {
    Type::List(Box::new(t))
}

/// Builds one function; nested regions are built by closures.
pub struct FuncBuilder {
    pub f: Function,
    stack: Vec<Vec<Op>>,
    line: u32,
}

impl FuncBuilder {
    pub fn new(name: &str, params: &[Type], results: &[Type]) -> (FuncBuilder, Vec<ValueId>) {
        let mut f = Function {
            name: name.to_string(),
            exported: true,
            tparams: vec![],
            params: vec![],
            results: results.to_vec(),
            values: vec![],
            body: Region::default(),
            loc: Loc { line: 1, col: 1 },
        };
        let mut ps = Vec::new();
        for (i, t) in params.iter().enumerate() {
            f.values.push(ValueDef {
                name: format!("p{i}"),
                ty: t.clone(),
            });
            ps.push(ValueId(i as u32));
        }
        f.params = ps.clone();
        (
            FuncBuilder {
                f,
                stack: vec![vec![]],
                line: 2,
            },
            ps,
        )
    }

    pub fn val(&mut self, ty: Type) -> ValueId {
        let id = ValueId(self.f.values.len() as u32);
        self.f.values.push(ValueDef {
            name: format!("v{}", id.0),
            ty,
        });
        id
    }

    fn push(&mut self, kind: OpKind, results: Vec<ValueId>) {
        let loc = Loc {
            line: self.line,
            col: 5,
        };
        self.line += 1;
        self.stack
            .last_mut()
            .unwrap()
            .push(Op { kind, results, loc });
    }

    /// The line the next op will get.
    pub fn next_line(&self) -> u32 {
        self.line
    }

    pub fn op(&mut self, opcode: Opcode, operands: Vec<Operand>, ty: Type) -> ValueId {
        let r = self.val(ty);
        self.push(
            OpKind::Simple {
                opcode,
                operands,
                annotation: None,
            },
            vec![r],
        );
        r
    }
    pub fn op_ann(&mut self, opcode: Opcode, operands: Vec<Operand>, ty: Type) -> ValueId {
        let r = self.val(ty.clone());
        self.push(
            OpKind::Simple {
                opcode,
                operands,
                annotation: Some(ty),
            },
            vec![r],
        );
        r
    }
    pub fn op0(&mut self, opcode: Opcode, operands: Vec<Operand>) {
        self.push(
            OpKind::Simple {
                opcode,
                operands,
                annotation: None,
            },
            vec![],
        );
    }
    pub fn call(&mut self, callee: Callee, args: Vec<Operand>, results: &[Type]) -> Vec<ValueId> {
        let rs: Vec<ValueId> = results.iter().map(|t| self.val(t.clone())).collect();
        self.push(
            OpKind::Call {
                callee,
                targs: vec![],
                args,
            },
            rs.clone(),
        );
        rs
    }

    fn region(&mut self, body: impl FnOnce(&mut FuncBuilder) -> OpKind) -> Region {
        self.stack.push(vec![]);
        let term = body(self);
        self.push(term, vec![]);
        Region {
            ops: self.stack.pop().unwrap(),
        }
    }

    pub fn if_(
        &mut self,
        cond: Operand,
        results: &[Type],
        then: impl FnOnce(&mut FuncBuilder) -> Vec<Operand>,
        els: impl FnOnce(&mut FuncBuilder) -> Vec<Operand>,
    ) -> Vec<ValueId> {
        let then_region = self.region(|b| OpKind::Yield(then(b)));
        let else_region = self.region(|b| OpKind::Yield(els(b)));
        let rs: Vec<ValueId> = results.iter().map(|t| self.val(t.clone())).collect();
        self.push(
            OpKind::If {
                cond,
                then_region,
                else_region,
            },
            rs.clone(),
        );
        rs
    }

    /// An `if` whose then-region returns.
    pub fn if_return(
        &mut self,
        cond: Operand,
        then: impl FnOnce(&mut FuncBuilder) -> Vec<Operand>,
    ) {
        let then_region = self.region(|b| OpKind::Return(then(b)));
        let else_region = self.region(|_| OpKind::Yield(vec![]));
        self.push(
            OpKind::If {
                cond,
                then_region,
                else_region,
            },
            vec![],
        );
    }

    pub fn for_(
        &mut self,
        lo: Operand,
        hi: Operand,
        step: Operand,
        iters: Vec<(Operand, Type)>,
        body: impl FnOnce(&mut FuncBuilder, ValueId, &[ValueId]) -> Vec<Operand>,
    ) -> Vec<ValueId> {
        let iv = self.val(Type::I64);
        let its: Vec<ValueId> = iters.iter().map(|(_, t)| self.val(t.clone())).collect();
        let its2 = its.clone();
        let body = self.region(|b| OpKind::Yield(body(b, iv, &its2)));
        let rs: Vec<ValueId> = iters.iter().map(|(_, t)| self.val(t.clone())).collect();
        self.push(
            OpKind::For {
                lo,
                hi,
                step,
                iv,
                iters: its,
                inits: iters.into_iter().map(|x| x.0).collect(),
                body,
            },
            rs.clone(),
        );
        rs
    }

    pub fn while_(
        &mut self,
        iters: Vec<(Operand, Type)>,
        cond: impl FnOnce(&mut FuncBuilder, &[ValueId]) -> Operand,
        body: impl FnOnce(&mut FuncBuilder, &[ValueId]) -> Vec<Operand>,
    ) -> Vec<ValueId> {
        let its: Vec<ValueId> = iters.iter().map(|(_, t)| self.val(t.clone())).collect();
        let (a, b2) = (its.clone(), its.clone());
        let cond_region = self.region(|b| OpKind::Condition(cond(b, &a)));
        let body = self.region(|b| OpKind::Yield(body(b, &b2)));
        let rs: Vec<ValueId> = iters.iter().map(|(_, t)| self.val(t.clone())).collect();
        self.push(
            OpKind::While {
                iters: its,
                inits: iters.into_iter().map(|x| x.0).collect(),
                cond_region,
                body,
            },
            rs.clone(),
        );
        rs
    }

    pub fn ret(&mut self, ops: Vec<Operand>) {
        self.push(OpKind::Return(ops), vec![]);
    }

    pub fn finish(mut self) -> Function {
        self.f.body = Region {
            ops: self.stack.pop().unwrap(),
        };
        self.f
    }
}

/// Builds a program: its functions, records and imports.
#[derive(Default)]
pub struct ProgramBuilder {
    pub prog: Program,
}

impl ProgramBuilder {
    pub fn new() -> ProgramBuilder {
        // Every program built by the tests runs in both tiers (interpreter and JIT) and must agree exactly.
        // (Benchmarks turn it off with `CROSS_CHECK`.)
        loom_vm::testing::set_jit_cross_check(
            CROSS_CHECK.load(std::sync::atomic::Ordering::Relaxed)
                && std::env::var("LOOM_VM_JIT_CROSS_CHECK").as_deref() != Ok("0"),
        );
        ProgramBuilder {
            prog: Program {
                files: vec!["test.loom".into()],
                ..Default::default()
            },
        }
    }
    /// Reserves a function index (for recursion), to be filled by `set`.
    pub fn reserve(&mut self, name: &str) -> u32 {
        let (b, _) = FuncBuilder::new(name, &[], &[]);
        self.prog.funcs.push(b.finish());
        self.prog.func_files.push(0);
        (self.prog.funcs.len() - 1) as u32
    }
    pub fn set(&mut self, i: u32, f: Function, export: Option<&str>) {
        if let Some(e) = export {
            self.prog.exports.push((e.to_string(), i));
        }
        self.prog.funcs[i as usize] = f;
    }
    pub fn add(&mut self, f: Function, export: Option<&str>) -> u32 {
        let i = self.reserve("");
        self.set(i, f, export);
        i
    }
    pub fn import(&mut self, symbol: &str, module: &str, params: &[Type], results: &[Type]) -> u32 {
        self.prog.imports.push(Decl {
            symbol: symbol.to_string(),
            tparams: vec![],
            sig: Signature {
                params: params.to_vec(),
                results: results.to_vec(),
            },
            import: Some(module.to_string()),
            loc: Loc { line: 3, col: 1 },
        });
        (self.prog.imports.len() - 1) as u32
    }
    pub fn record(&mut self, name: &str, fields: &[(&str, Type)]) -> u32 {
        self.prog.records.push(Record {
            name: name.into(),
            exported: true,
            fields: fields
                .iter()
                .map(|(n, t)| (n.to_string(), t.clone()))
                .collect(),
            loc: Loc::default(),
        });
        (self.prog.records.len() - 1) as u32
    }
    pub fn load(&self) -> Loaded {
        Vm::load(&self.prog, &[], &[], &LoadLimits::default()).expect("load")
    }
    pub fn load_with(
        &self,
        natives: &[Arc<NativeModule>],
        granted: &[&str],
    ) -> Result<Loaded, LoadError> {
        Vm::load(&self.prog, natives, granted, &LoadLimits::default())
    }
}

/// Whether programs built with [`ProgramBuilder`] turn on the VM's JIT cross-check (see `loom_vm::testing`).
pub static CROSS_CHECK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// A one-function program `main(params) -> results` built by `body`.
pub fn single(
    params: &[Type],
    results: &[Type],
    body: impl FnOnce(&mut FuncBuilder, &[ValueId]),
) -> Loaded {
    single_jit(params, results, LoadLimits::default().jit, body)
}

/// [`single`] with the JIT tier on or off.
pub fn single_jit(
    params: &[Type],
    results: &[Type],
    jit: bool,
    body: impl FnOnce(&mut FuncBuilder, &[ValueId]),
) -> Loaded {
    let (mut b, ps) = FuncBuilder::new("t.main", params, results);
    body(&mut b, &ps);
    let mut pb = ProgramBuilder::new();
    pb.add(b.finish(), Some("main"));
    let lim = LoadLimits {
        jit,
        ..Default::default()
    };
    Vm::load(&pb.prog, &[], &[], &lim).expect("load")
}

pub fn run(l: &Loaded, args: &[Value]) -> Result<Vec<Value>, Trap> {
    l.invoke("main", args, &InvokeLimits::default())
}

/// Evaluates `opcode a, b` on constants passed as arguments (so nothing is folded).
pub fn binop(opcode: Opcode, t: Type, rt: Type, a: Value, b: Value) -> Result<Value, Trap> {
    let rts = [rt];
    let l = single(&[t.clone(), t], &rts, |b, p| {
        let r = b.op(opcode, vec![v(p[0]), v(p[1])], rts[0].clone());
        b.ret(vec![v(r)]);
    });
    run(&l, &[a, b]).map(|mut r| r.remove(0))
}

pub fn unop(opcode: Opcode, t: Type, rt: Type, a: Value) -> Result<Value, Trap> {
    let rts = [rt];
    let l = single(&[t], &rts, |b, p| {
        let r = b.op(opcode, vec![v(p[0])], rts[0].clone());
        b.ret(vec![v(r)]);
    });
    run(&l, &[a]).map(|mut r| r.remove(0))
}
