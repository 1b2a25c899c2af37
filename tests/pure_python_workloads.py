"""Two pure-Python workloads in the spirit of pyperformance's richards and raytrace (written
here from scratch): many small methods, no I/O, no C extensions, so every profiler can see all
of the time.  ``run_for(name, seconds)`` repeats one of them for about that long."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

# -- scheduler: a tiny operating system of tasks passing packets (richards-like) ------------------

IDLE, WORKER, HANDLER_A, HANDLER_B, DEVICE_A, DEVICE_B = range(6)


class Packet:
    """A message passed between tasks."""

    def __init__(self, link: Packet | None, owner: int, kind: int) -> None:
        self.link = link
        self.owner = owner
        self.kind = kind
        self.datum = 0
        self.payload = [0, 0, 0, 0]

    def append_to(self, queue: Packet | None) -> Packet:
        """This packet at the end of ``queue``; returns the queue's head."""
        self.link = None
        if queue is None:
            return self
        tail = queue
        while tail.link is not None:
            tail = tail.link
        tail.link = self
        return queue


class Task:
    """A schedulable task with a priority, an input queue and three state bits."""

    def __init__(self, system: System, ident: int, priority: int, queue: Packet | None) -> None:
        self.system = system
        self.ident = ident
        self.priority = priority
        self.queue = queue
        self.waiting = queue is None
        self.held = False
        self.next: Task | None = None
        system.add(self)

    def runnable(self) -> bool:
        """Not held, and either not waiting or with a packet to read."""
        return not self.held and (not self.waiting or self.queue is not None)

    def take_packet(self) -> Packet | None:
        """Remove the first packet of the queue."""
        packet = self.queue
        if packet is not None:
            self.queue = packet.link
        return packet

    def deliver(self, packet: Packet) -> Task:
        """Queue a packet for this task; returns the task to run next."""
        self.queue = packet.append_to(self.queue)
        current = self.system.current
        assert current is not None
        return self if self.priority > current.priority and not self.held else current

    def step(self, packet: Packet | None) -> Task:
        """Run once with the packet taken (or None); returns the task to run next."""
        raise NotImplementedError


class IdleTask(Task):
    """Releases the device tasks in a pseudo-random order."""

    def __init__(self, system: System, ident: int, count: int) -> None:
        super().__init__(system, ident, 0, None)
        self.seed = 1
        self.count = count
        self.waiting = False

    def step(self, packet: Packet | None) -> Task:
        self.count -= 1
        if self.count == 0:
            return self.system.hold_current()
        if self.seed & 1:
            self.seed = (self.seed >> 1) ^ 0xD008
            return self.system.release(DEVICE_B)
        self.seed >>= 1
        return self.system.release(DEVICE_A)


class WorkerTask(Task):
    """Fills packets with letters and sends them to the two handlers in turn."""

    def __init__(self, system: System, ident: int, queue: Packet | None) -> None:
        super().__init__(system, ident, 1000, queue)
        self.destination = HANDLER_A
        self.letter = 0

    def step(self, packet: Packet | None) -> Task:
        if packet is None:
            return self.system.wait_current()
        self.destination = HANDLER_B if self.destination == HANDLER_A else HANDLER_A
        packet.owner = self.destination
        packet.datum = 0
        for i in range(4):
            self.letter = self.letter % 26 + 1
            packet.payload[i] = self.letter
        return self.system.send(packet, self.destination)


class HandlerTask(Task):
    """Pairs work packets with device packets and forwards one letter at a time."""

    def __init__(self, system: System, ident: int, queue: Packet | None) -> None:
        super().__init__(system, ident, 2000 + ident, queue)
        self.work: Packet | None = None
        self.devices: Packet | None = None

    def step(self, packet: Packet | None) -> Task:
        if packet is not None:
            if packet.kind == WORKER:
                self.work = packet.append_to(self.work)
            else:
                self.devices = packet.append_to(self.devices)
        work = self.work
        if work is None:
            return self.system.wait_current()
        if work.datum >= 4:
            self.work = work.link
            return self.system.send(work, WORKER)
        device = self.devices
        if device is None:
            return self.system.wait_current()
        self.devices = device.link
        device.datum = work.payload[work.datum]
        work.datum += 1
        return self.system.send(device, device.owner)


class DeviceTask(Task):
    """Holds one packet until released, then returns it to its handler."""

    def __init__(self, system: System, ident: int) -> None:
        super().__init__(system, ident, 4000 + ident, None)
        self.pending: Packet | None = None

    def step(self, packet: Packet | None) -> Task:
        if packet is None:
            pending = self.pending
            if pending is None:
                return self.system.wait_current()
            self.pending = None
            return self.system.send(pending, HANDLER_A if self.ident == DEVICE_A else HANDLER_B)
        self.pending = packet
        return self.system.hold_current()


class System:
    """The scheduler: runs the highest-priority runnable task until none is left."""

    def __init__(self) -> None:
        self.tasks: dict[int, Task] = {}
        self.head: Task | None = None
        self.current: Task | None = None

    def add(self, task: Task) -> None:
        """Register a task (kept in priority order, highest first)."""
        self.tasks[task.ident] = task
        if self.head is None or task.priority > self.head.priority:
            task.next, self.head = self.head, task
            return
        node = self.head
        while node.next is not None and node.next.priority >= task.priority:
            node = node.next
        task.next, node.next = node.next, task

    def find(self, ident: int) -> Task:
        """The task with this id."""
        return self.tasks[ident]

    def hold_current(self) -> Task:
        """Hold the running task; the next in priority order runs."""
        current = self.current
        assert current is not None
        current.held = True
        return current.next or current

    def wait_current(self) -> Task:
        """The running task waits for a packet."""
        current = self.current
        assert current is not None
        current.waiting = True
        return current

    def release(self, ident: int) -> Task:
        """Release a held task; it runs next if it outranks the running one."""
        task = self.find(ident)
        task.held = False
        current = self.current
        assert current is not None
        return task if task.priority > current.priority else current

    def send(self, packet: Packet, ident: int) -> Task:
        """Queue a packet for a task."""
        packet.kind = self.current.ident if self.current is not None else 0
        return self.find(ident).deliver(packet)

    def run(self) -> int:
        """Schedule until no task can run; returns the number of steps."""
        steps = 0
        task = self.head
        while task is not None:
            if task.runnable():
                self.current = task
                packet = task.take_packet() if task.waiting or task.queue is not None else None
                if packet is not None:
                    task.waiting = False
                task = task.step(packet)
                steps += 1
                if task.held and not task.runnable():
                    task = task.next
            else:
                task = task.next
        return steps


def scheduler(rounds: int = 1) -> int:
    """Build the task system and run it ``rounds`` times; returns the total steps."""
    total = 0
    for _ in range(rounds):
        system = System()
        IdleTask(system, IDLE, 2000)
        queue = Packet(None, 0, WORKER)
        queue = Packet(queue, 0, WORKER)
        WorkerTask(system, WORKER, queue)
        for handler, device in ((HANDLER_A, DEVICE_A), (HANDLER_B, DEVICE_B)):
            devices = None
            for _ in range(3):
                devices = Packet(devices, device, DEVICE_A)
            HandlerTask(system, handler, devices)
            DeviceTask(system, device)
        total += system.run()
    return total


# -- ray tracer (raytrace-like) -------------------------------------------------------------------


class Vector:
    """A 3-vector."""

    def __init__(self, x: float, y: float, z: float) -> None:
        self.x = x
        self.y = y
        self.z = z

    def dot(self, other: Vector) -> float:
        """Scalar product."""
        return self.x * other.x + self.y * other.y + self.z * other.z

    def magnitude(self) -> float:
        """Length."""
        return math.sqrt(self.dot(self))

    def plus(self, other: Vector) -> Vector:
        """Sum."""
        return Vector(self.x + other.x, self.y + other.y, self.z + other.z)

    def minus(self, other: Vector) -> Vector:
        """Difference."""
        return Vector(self.x - other.x, self.y - other.y, self.z - other.z)

    def scale(self, factor: float) -> Vector:
        """Scaled copy."""
        return Vector(self.x * factor, self.y * factor, self.z * factor)

    def normalized(self) -> Vector:
        """Unit vector of the same direction."""
        return self.scale(1.0 / self.magnitude())

    def reflect(self, normal: Vector) -> Vector:
        """Mirror image about a unit normal."""
        return self.minus(normal.scale(2 * self.dot(normal)))


class Ray:
    """A half-line: a point and a unit direction."""

    def __init__(self, point: Vector, direction: Vector) -> None:
        self.point = point
        self.direction = direction.normalized()

    def at(self, t: float) -> Vector:
        """The point at distance t."""
        return self.point.plus(self.direction.scale(t))


class Sphere:
    """A sphere: centre and radius."""

    def __init__(self, centre: Vector, radius: float) -> None:
        self.centre = centre
        self.radius = radius

    def intersectionTime(self, ray: Ray) -> float | None:
        """Distance along the ray to the nearest hit, or None."""
        cp = self.centre.minus(ray.point)
        v = cp.dot(ray.direction)
        discriminant = self.radius * self.radius - (cp.dot(cp) - v * v)
        if discriminant < 0:
            return None
        t = v - math.sqrt(discriminant)
        return t if t > 1e-9 else None

    def normalAt(self, p: Vector) -> Vector:
        """Unit normal at a point of the surface."""
        return p.minus(self.centre).normalized()


class Plane:
    """A plane: a point and a unit normal."""

    def __init__(self, point: Vector, normal: Vector) -> None:
        self.point = point
        self.normal = normal.normalized()

    def intersectionTime(self, ray: Ray) -> float | None:
        """Distance along the ray to the plane, or None."""
        along = ray.direction.dot(self.normal)
        if along >= 0:
            return None
        t = self.point.minus(ray.point).dot(self.normal) / along
        return t if t > 1e-9 else None

    def normalAt(self, p: Vector) -> Vector:
        """The plane's normal."""
        return self.normal


class Scene:
    """Objects, one light, and a pinhole camera."""

    def __init__(self) -> None:
        self.objects: list[Sphere | Plane] = [
            Sphere(Vector(0.0, 1.0, 5.0), 1.0),
            Sphere(Vector(-1.8, 0.6, 6.0), 0.6),
            Sphere(Vector(1.6, 0.5, 4.5), 0.5),
            Plane(Vector(0.0, 0.0, 0.0), Vector(0.0, 1.0, 0.0)),
        ]
        self.light = Vector(-3.0, 6.0, 0.0)
        self.eye = Vector(0.0, 1.2, -2.0)

    def first_hit(self, ray: Ray) -> tuple[float, Sphere | Plane] | None:
        """The nearest object the ray meets."""
        best: tuple[float, Sphere | Plane] | None = None
        for obj in self.objects:
            t = obj.intersectionTime(ray)
            if t is not None and (best is None or t < best[0]):
                best = (t, obj)
        return best

    def lit(self, point: Vector) -> bool:
        """Whether the light sees the point."""
        to_light = self.light.minus(point)
        hit = self.first_hit(Ray(point, to_light))
        return hit is None or hit[0] > to_light.magnitude()

    def colour(self, ray: Ray, depth: int) -> float:
        """Brightness seen along a ray (diffuse light, shadows, one bounce of reflection)."""
        hit = self.first_hit(ray)
        if hit is None:
            return 0.1
        t, obj = hit
        point = ray.at(t)
        normal = obj.normalAt(point)
        shade = 0.05
        if self.lit(point):
            shade += max(0.0, normal.dot(self.light.minus(point).normalized()))
        if depth < 1:
            shade += 0.3 * self.colour(Ray(point, ray.direction.reflect(normal)), depth + 1)
        return shade

    def render(self, width: int, height: int) -> float:
        """Trace one ray per pixel; returns the summed brightness."""
        total = 0.0
        for row in range(height):
            for col in range(width):
                target = Vector(col / width - 0.5, 1.2 - (row / height - 0.5), 0.0)
                total += self.colour(Ray(self.eye, target.minus(self.eye)), 0)
        return total


def raytracer(size: int = 32) -> float:
    """Render the scene at size x size pixels."""
    return Scene().render(size, size)


# -- queens: every placement of n queens, from a generator of permutations (nqueens-like) --------
# Generators all the way down: the permutations generator builds each tuple from a generator
# expression, and the solver tests each one with two more, so most of the time is spent in
# frames that are resumed and suspended, not called and returned from.


def permutations(items: range) -> Iterator[tuple[int, ...]]:
    """Every ordering of ``items``, in lexicographic order of positions (as itertools')."""
    pool = tuple(items)
    n = len(pool)
    order = list(range(n))
    countdown = list(range(n, 0, -1))
    yield tuple(pool[i] for i in order)
    while n:
        for i in reversed(range(n)):
            countdown[i] -= 1
            if countdown[i] == 0:
                order[i:] = order[i + 1 :] + order[i : i + 1]
                countdown[i] = n - i
            else:
                j = countdown[i]
                order[i], order[-j] = order[-j], order[i]
                yield tuple(pool[i] for i in order)
                break
        else:
            return


def queen_placements(count: int) -> Iterator[tuple[int, ...]]:
    """The column of the queen on each row, for every placement where none attack another."""
    rows = range(count)
    for columns in permutations(rows):
        diagonals = len(set(columns[r] + r for r in rows))  # generators, as nqueens has them
        if count == diagonals == len(set(columns[r] - r for r in rows)):
            yield columns


def queens(count: int = 8) -> int:
    """How many ways ``count`` queens fit on a ``count`` x ``count`` board."""
    return len(list(queen_placements(count)))


WORKLOADS: dict[str, Callable[[], object]] = {
    "richards": scheduler,
    "raytrace": raytracer,
    "nqueens": queens,
}


def run_for(name: str, seconds: float) -> int:
    """Repeat a workload for about ``seconds``; returns the number of repetitions."""
    work = WORKLOADS[name]
    end = time.perf_counter() + seconds
    count = 0
    while time.perf_counter() < end:
        work()
        count += 1
    return count
