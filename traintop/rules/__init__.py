"""The rule catalogue: every rule, single-host and cross-host, with what it declares (rules/declaration.py)."""

from functools import lru_cache

from traintop.rules.across import CROSS_HOST_RULES, CrossRule
from traintop.rules.config import DEFAULT, Thresholds
from traintop.rules.declaration import CLUSTER, HOST, Declared, HostRule
from traintop.rules.engine import HOLDS, LAPSED, REVERSED, WEAK, Verdict, RuleContext, RulesEngine, Severity
from traintop.findings import Finding
from traintop.rules.cpu_training import TrainingOnCpu
from traintop.rules.fragmentation import Fragmentation
from traintop.rules.gpu_errors import GpuErrors
from traintop.rules.host_memory import HostMemoryPressure
from traintop.rules.idle_gpu import IdleWhileAlive
from traintop.rules.imbalance import Imbalance
from traintop.rules.low_clocks import ClocksBelowMax
from traintop.rules.memory_creep import MemoryCreep
from traintop.rules.oom import OutOfMemory
from traintop.rules.other_process import OtherProcess
from traintop.rules.pause import Pause
from traintop.rules.pcie import PcieBottleneck
from traintop.rules.precision import FullPrecision
from traintop.rules.power_cap import PowerCapAtFullLoad
from traintop.rules.starvation import Starvation
from traintop.rules.stall import Stall
from traintop.rules.skipped_steps import SkippedSteps
from traintop.rules.step_regression import StepTimeRegression
from traintop.rules.straggler import Straggler
from traintop.rules.thermal import ThermalThrottle
from traintop.rules.underuse import Underuse


# Bump when a rule's logic or default thresholds change: recordings made with another
# version get their rules re-run by `traintop analyze` instead of trusting their alerts.
RULES_VERSION = 13  # 13: slower steps read from the step count, a slow leak from its floor over minutes, host memory pressure ends once freed, starvation explains slower steps; 12: optimizer steps a GradScaler skipped; 11: a cause never begins after its effect, the stall explains the pauses of its hang, slower steps said while slow, a rank waiting for another host is not starved; 10: a wait in a blocking collective is a pause, gloo named as the source of copies; 9: pauses and full fp32 from the probe's ledger and precision; 8: findings hold now (2026-12-02)


def default_rules() -> list:
    # In the order the engine judges them: a rule reads the verdicts of those before it in this
    # evaluation, so it comes after every rule it defers to (``defers_to``; a test checks it), and
    # underuse after memory creep and fragmentation (it does not advise a larger batch while memory
    # creeps or fragments).
    return [PcieBottleneck(), Stall(), Straggler(), Starvation(), Pause(), ThermalThrottle(), PowerCapAtFullLoad(),
            FullPrecision(), MemoryCreep(), OutOfMemory(), Fragmentation(), Underuse(), TrainingOnCpu(), StepTimeRegression(), SkippedSteps(), IdleWhileAlive(), OtherProcess(),
            HostMemoryPressure(), Imbalance(), ClocksBelowMax(), GpuErrors()]


def default_engine(config: Thresholds = DEFAULT) -> RulesEngine:
    return RulesEngine(rules=default_rules(), config=config)


def catalogue() -> tuple[Declared, ...]:
    """Every rule traintop judges: the single-host ones (``scope`` host), then the cross-host ones."""
    return (*default_rules(), *CROSS_HOST_RULES)


def declared(rule_id: str, scope: str = HOST) -> Declared | None:
    """The rule of that id in that scope; a host-scope id not found there may be a cross-host rule's
    that an agent raises too (a rank claimed twice on its own node)."""
    index = _index()
    found = index.get((scope, rule_id))
    return index.get((CLUSTER, rule_id)) if found is None and scope == HOST else found


@lru_cache(maxsize=1)
def _index() -> dict[tuple[str, str], Declared]:
    return {(r.scope, r.id): r for r in catalogue()}


__all__ = [
    "CLUSTER", "CROSS_HOST_RULES", "CrossRule", "Declared", "HOST", "HostRule",
    "DEFAULT", "Finding", "HOLDS", "LAPSED", "REVERSED", "WEAK", "RULES_VERSION", "Verdict", "RuleContext", "RulesEngine", "Severity", "Thresholds",
    "catalogue", "declared", "default_engine", "default_rules",
]
