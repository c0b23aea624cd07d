-- Argo CD health of a kserve-canary.dev PromotionPolicy, read from the status the controller writes
-- (docs/gitops.md#argo-cd-health-check). Lua 5.1 as Argo CD runs it (gopher-lua): no goto, no integer division.
-- The cases it must get right: deploy/argocd/health-cases.yaml (tests/deploy/test_crd_manifests.py).
local hs = {}

local function condition(status, wanted)
  if status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == wanted then
      return c
    end
  end
  return nil
end

local function is_true(c)
  return c ~= nil and c.status == "True"
end

local function message_of(c, fallback)
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  return fallback
end

local status = obj.status
if status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kserve-canary controller to report on this policy"
  return hs
end

-- A status older than the spec says nothing about the spec (kstatus reads it the same way).
local generation = nil
if obj.metadata ~= nil then
  generation = obj.metadata.generation
end
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the controller to observe generation " .. tostring(generation)
  return hs
end

local valid = condition(status, "PolicyValid")
if valid ~= nil and valid.status == "False" then
  hs.status = "Degraded"
  hs.message = message_of(valid, "The policy is invalid")
  return hs
end

local conflict = condition(status, "Conflict")
if is_true(conflict) then
  hs.status = "Degraded"
  hs.message = message_of(conflict, "Another policy governs the same InferenceService")
  return hs
end

if status.phase == "Invalid" then
  hs.status = "Degraded"
  hs.message = "The policy is not in force (see status.conditions)"
  return hs
end

local rolled_back = condition(status, "RolledBack")
if status.phase == "RolledBack" or is_true(rolled_back) then
  hs.status = "Degraded"
  hs.message = message_of(rolled_back, "The canary revision was rolled back")
  return hs
end

local reconciling = condition(status, "Reconciling")
local stalled = condition(status, "Stalled")
if status.phase == "Paused" then
  hs.status = "Suspended"
  if is_true(stalled) then
    hs.message = message_of(stalled, "The rollout is paused")
  else
    hs.message = message_of(reconciling, "The rollout is paused")
  end
  return hs
end

if is_true(stalled) then
  hs.status = "Degraded"
  hs.message = message_of(stalled, "The rollout cannot go on")
  return hs
end

local moving = { Pending = true, Progressing = true, Promoting = true, Baking = true }
if is_true(reconciling) or (status.phase ~= nil and moving[status.phase]) then
  hs.status = "Progressing"
  hs.message = message_of(reconciling, "Rollout " .. tostring(status.phase))
  return hs
end

local ready = condition(status, "Ready")
if is_true(ready) or status.phase == "Idle" or status.phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = message_of(ready, "No rollout under way")
  return hs
end

hs.status = "Progressing"
hs.message = message_of(ready, "Waiting for the controller")
return hs
